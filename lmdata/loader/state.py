"""The Loader's resume state: what it holds and the one place a saved state is checked.

A state is a small JSON dict: the step, the configuration that decides the rows, each source's
size, the mixture (weights as exact fractions, the step and per-source rows its rounding starts
from) and the rows each source has served. It holds no rank or worker layout.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from lmdata.errors import InvalidInputError

STATE_VERSION = 1
_INTS = ("step", "global_batch_size", "seq_len", "seed", "base_step")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bad(what: str) -> InvalidInputError:
    return InvalidInputError(
        f"not a valid lmdata Loader state: {what}; pass a dict saved by Loader.state_dict() "
        "(unchanged, or through a JSON round trip)"
    )


def check_state(state: Any) -> dict[str, Any]:
    """``state`` with its weights as Fractions, after checking every field's type and the
    per-source lists' lengths; anything else is an InvalidInputError naming the field."""
    if not isinstance(state, dict):
        raise _bad(f"a {type(state).__name__}, not a dict")
    if state.get("version") != STATE_VERSION:
        raise _bad(f"'version' is {state.get('version')!r}, this lmdata reads {STATE_VERSION}")
    for key in _INTS:
        v = state.get(key)
        if not _is_int(v) or v < 0:
            raise _bad(f"{key!r} is {v!r}, not a non-negative integer")
    if state["global_batch_size"] < 1:
        raise _bad("'global_batch_size' is 0")
    if state["base_step"] > state["step"]:
        raise _bad(f"'base_step' {state['base_step']} is after 'step' {state['step']}")
    sources = state.get("sources")
    if not isinstance(sources, list) or not sources:
        raise _bad(f"'sources' is {sources!r}, not a non-empty list")
    for k, s in enumerate(sources):
        if not isinstance(s, dict) or not all(_is_int(s.get(f)) for f in ("tokens", "rows")):
            raise _bad(f"sources[{k}] is {s!r}, not a dict with integer 'tokens' and 'rows'")
    n = len(sources)
    for key in ("weights", "base_rows", "served"):
        v = state.get(key)
        if not isinstance(v, list) or len(v) != n:
            raise _bad(f"{key!r} is {v!r}, not a list of {n} entries (one per source)")
    for key in ("base_rows", "served"):
        if not all(_is_int(x) and x >= 0 for x in state[key]):
            raise _bad(f"{key!r} is {state[key]!r}, not non-negative integers")
    weights = []
    for k, w in enumerate(state["weights"]):
        try:
            f = Fraction(w) if isinstance(w, str) else None
        except (ValueError, ZeroDivisionError):
            f = None
        if f is None or f < 0:
            raise _bad(f"weights[{k}] is {w!r}, not a non-negative fraction like '1/3'")
        weights.append(f)
    if sum(weights) != 1:
        raise _bad(f"the weights {state['weights']!r} do not sum to 1")
    return {**state, "weights": tuple(weights)}
