"""The value checks every config parser shares (:mod:`lmdata.dolma.config`,
:mod:`lmdata.dolma._minhash_config`, :mod:`lmdata.dolma._decontam_config`): each wrong value
an InvalidInputError naming its key."""

from __future__ import annotations

from typing import Any

from lmdata.errors import InvalidInputError


def as_list(v: Any, what: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise InvalidInputError(f"{what} must be a list of strings, got {v!r}")


def as_int(v: Any, what: str, minimum: int = 0) -> int:
    """``v`` if it is an integer >= ``minimum``; anything else (a quoted number, a float, a
    boolean) is an InvalidInputError naming the config key."""
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        hint = ""
        if isinstance(v, str) and v.strip().lstrip("+-").isdigit():
            hint = f" (a quoted string: write {what}: {v.strip()} without quotes)"
        raise InvalidInputError(f"{what} must be an integer >= {minimum}, got {v!r}{hint}")
    return v


def options(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise InvalidInputError(
            f"storage_options must be a mapping of fsspec options, got {type(v).__name__}"
        )
    return dict(v) or None
