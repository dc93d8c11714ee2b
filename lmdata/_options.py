"""Keyword options checked by name, in one place for every public verb, reader and writer.

An option a function does not take is an :class:`~lmdata.errors.InvalidInputError` that
names the valid ones and the closest match (``eod_idd`` -> ``eod_id``), never a silent no-op
(the check the user meant never runs) nor a raw ``TypeError`` from deep inside a reader.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from lmdata.errors import InvalidInputError

F = TypeVar("F", bound=Callable[..., Any])


def unknown_option(name: str, valid: Iterable[str], what: str) -> InvalidInputError:
    """The error for option ``name`` that ``what`` (``"lmdata.open of modalities"``) does not
    take: the closest valid name, then all of them."""
    names = sorted(set(valid))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    takes = f" ({what} takes {', '.join(names)})" if names else f" ({what} takes no options)"
    return InvalidInputError(f"unknown option {name!r} for {what}{hint}{takes}")


def check_options(given: Iterable[str], valid: Iterable[str], what: str) -> None:
    """An InvalidInputError for the first name in ``given`` that is not in ``valid``."""
    allowed = set(valid)
    for name in given:
        if name not in allowed:
            raise unknown_option(name, allowed, what)


def _target(fn: Any) -> Any:
    """The function behind a lazy verb (:func:`lmdata.formats._spec.lazy`), imported now."""
    resolve = getattr(fn, "resolve", None)
    return resolve() if callable(resolve) else fn


def parameters(fn: Any, *, skip: int = 1) -> frozenset[str] | None:
    """The names ``fn`` takes as keywords, after its first ``skip`` positional parameters (the
    path), or None when it takes any (``**kwargs``)."""
    sig = inspect.signature(_target(fn))
    names = []
    for k, p in enumerate(sig.parameters.values()):
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) or k < skip:
            continue
        names.append(p.name)
    return frozenset(names)


def check_call(
    fn: Any, options: Mapping[str, Any], what: str, also: Iterable[str] = (), skip: int = 1
) -> None:
    """Refuse the ``options`` that ``fn`` does not take (``also``: the caller's own options,
    listed as valid in the message)."""
    taken = parameters(fn, skip=skip)
    if taken is not None:
        check_options(options, taken | set(also), what)


def checked(what: str, *, hide: Iterable[str] = ()) -> Callable[[F], F]:
    """A decorator: the function (or ``__init__``) refuses unknown keyword options with
    :func:`unknown_option` naming it ``what`` (``"lmdata.Loader"``), instead of a raw
    ``TypeError``; its signature and typing are unchanged. The message lists its options (not
    its required positional arguments, nor the deprecated names in ``hide``)."""

    def wrap(fn: F) -> F:
        params = list(inspect.signature(fn).parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            raise TypeError(f"{fn.__qualname__} takes **kwargs: nothing to check")
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        valid = frozenset(p.name for p in named) - {"self"}
        shown = {
            p.name for p in named if p.kind is p.KEYWORD_ONLY or p.default is not p.empty
        } - set(hide)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for k in kwargs:
                if k not in valid:
                    raise unknown_option(k, shown, what)
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
