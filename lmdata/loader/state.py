"""The Loader's resume state: what it holds and the one place a saved state is parsed.

A state is a small JSON dict: the step, the configuration that decides the rows, each source's
size, the mixture (weights as exact fractions, the step and per-source rows its rounding starts
from) and the rows each source has served. It holds no rank or worker layout.

A saved state is untrusted input. :func:`parse_state` reads only the fields it knows, each with
bounds first (type, string length, integer magnitude, list length; a nested value where a number
belongs is refused, never walked), then checks them together; anything else is an
InvalidInputError whose message shows values in a few dozen characters (:func:`show`), never
whole. The same goes for the state of a torch dataset made by ``Loader.to_torch`` (one worker's
position) and for a torchdata ``StatefulDataLoader`` state holding those: both come down to a
Loader state and the global step to continue from, whatever the number of workers was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fractions import Fraction
from math import gcd
from typing import Any, TypeGuard

from lmdata.errors import InvalidInputError

STATE_VERSION = 1
TORCH_STATE_VERSION = 1  # the torch dataset's own state (``Loader.to_torch``), around a Loader's
MAX_ROWS = 2**60  # rows (and steps) a state may be at: beyond any run, far from int64's end
MAX_SOURCES = 1 << 16
_INT_BOUND = 2**63  # any integer field, before its own check
_NAME_CHARS = 4096  # a source's name (the reader's repr: a path or URL)
_LAYOUT_CHARS = 256  # a bestfit source's layout
_WORD_CHARS = 64  # mode, long_docs, rounding, content digest
_WEIGHT = re.compile(r"([0-9]{1,1000})(?:/([0-9]{1,1000}))?")
_DENOMINATOR_BITS = 8192  # the weights' common denominator (float weights need about 2200)
_MAX_WORKERS = 1 << 12  # DataLoader workers in a torch state


def show(v: Any) -> str:
    """A few dozen characters saying what ``v`` is: never its whole text or nesting."""
    if v is None or isinstance(v, (bool, float)):
        return repr(v)
    if isinstance(v, int):
        return str(v) if -(10**30) < v < 10**30 else f"an integer of {v.bit_length()} bits"
    if isinstance(v, str):
        return repr(v) if len(v) <= 60 else f"{v[:40]!r}... ({len(v)} characters)"
    name = type(v).__name__[:40]
    if isinstance(v, (dict, list, tuple)):
        return f"a {name} of {len(v)} entries"
    return f"a {name}"


def _bad(what: str) -> InvalidInputError:
    return InvalidInputError(
        f"not a valid lmdata Loader state: {what}; pass a dict saved by Loader.state_dict() "
        "(unchanged, or through a JSON round trip)"
    )


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(where: str, v: Any, lo: int = 0, hi: int = _INT_BOUND) -> int:
    """``v`` if it is an int in ``[lo, hi)``."""
    if not _is_int(v) or not lo <= v < hi:
        what = "a non-negative integer" if lo == 0 else f"an integer >= {lo}"
        power = hi & (hi - 1) == 0 and hi > 2**20
        bound = "" if hi == _INT_BOUND else f" below {f'2^{hi.bit_length() - 1}' if power else hi}"
        raise _bad(f"{where} is {show(v)}, not {what}{bound}")
    return int(v)


def _word(where: str, v: Any, chars: int = _WORD_CHARS) -> str | None:
    """``v`` if it is None or a string of at most ``chars`` characters."""
    if v is not None and (not isinstance(v, str) or len(v) > chars):
        raise _bad(f"{where} is {show(v)}, not a string of at most {chars} characters")
    return v


def _list(where: str, v: Any, n: int | None) -> list[Any]:
    if not isinstance(v, (list, tuple)) or (n is not None and len(v) != n):
        want = "a list" if n is None else f"a list of {n} entries (one per source)"
        raise _bad(f"{where} is {show(v)}, not {want}")
    return list(v)


@dataclass(frozen=True)
class SavedSource:
    """A source as a state describes it: its size and (newer states) a digest of its tokens."""

    tokens: int
    rows: int
    content: str | None = None
    name: str | None = None
    layout: str | None = None  # bestfit: the packing layout (loader/bestfit.py Plan.describe)


@dataclass(frozen=True)
class SavedState:
    """A parsed Loader state: every field bounded and checked. ``step`` is where to continue:
    the state's own step (``saved_step``, which ``served`` counts up to), or for a torch state
    the step after the last batch the training received."""

    step: int
    saved_step: int
    global_batch_size: int
    seq_len: int
    seed: int
    mode: str | None
    shuffle: bool | None
    epochs: int | None
    long_docs: str | None
    drop_last: bool | None
    sources: tuple[SavedSource, ...]
    weights: tuple[Fraction, ...]
    base_step: int
    base_rows: tuple[int, ...]
    served: tuple[int, ...]
    rounding: str

    def setting(self, key: str) -> Any:
        """A configuration field as the Loader compares it (older states lack drop_last)."""
        v = getattr(self, key)
        return False if key == "drop_last" and v is None else v


def _weights(raw: list[Any]) -> tuple[Fraction, ...]:
    """Weight strings such as ``'1/3'``: digits only (never an exponent whose value a Fraction
    would compute), a bounded common denominator, summing to exactly 1."""
    parts = []
    for k, w in enumerate(raw):
        m = _WEIGHT.fullmatch(w) if isinstance(w, str) else None
        den = int(m.group(2)) if m and m.group(2) else 1
        if m is None or den == 0:
            raise _bad(f"weights[{k}] is {show(w)}, not a non-negative fraction like '1/3'")
        parts.append((int(m.group(1)), den))
    common = 1
    for _, den in parts:
        common = common // gcd(common, den) * den
        if common.bit_length() > _DENOMINATOR_BITS:
            raise _bad(f"the weights' common denominator exceeds 2^{_DENOMINATOR_BITS}")
    if sum(num * (common // den) for num, den in parts) != common:
        listed = ", ".join(show(w) for w in raw[:4]) + (", ..." if len(raw) > 4 else "")
        raise _bad(f"the weights [{listed}] do not sum to 1")
    return tuple(Fraction(num, den) for num, den in parts)


def parse_state(state: Any) -> SavedState:
    """A Loader state, a ``to_torch`` dataset's state or a StatefulDataLoader's, parsed and
    checked (module docstring); an InvalidInputError naming the field otherwise."""
    if not isinstance(state, dict):
        raise _bad(f"{show(state)}, not a dict")
    if "version" not in state and ("lmdata_torch" in state or _is_torchdata(state)):
        return _parse_torch(state)
    return _parse_loader(state)


def _parse_loader(state: dict[str, Any]) -> SavedState:
    if state.get("version") != STATE_VERSION:
        raise _bad(f"'version' is {show(state.get('version'))}, this lmdata reads {STATE_VERSION}")
    saved = _int("'step'", state.get("step"), 0, MAX_ROWS)
    g = _int("'global_batch_size'", state.get("global_batch_size"), 1, MAX_ROWS)
    base_step = _int("'base_step'", state.get("base_step"), 0, MAX_ROWS)
    if base_step > saved:
        raise _bad(f"'base_step' {base_step} is after 'step' {saved}")
    sources = _list("'sources'", state.get("sources"), None)
    if not sources or len(sources) > MAX_SOURCES:
        raise _bad(f"'sources' is {show(sources)}, not a list of 1 to {MAX_SOURCES} sources")
    parsed = []
    for k, s in enumerate(sources):
        if not isinstance(s, dict) or not all(_is_int(s.get(f)) for f in ("tokens", "rows")):
            raise _bad(f"sources[{k}] is {show(s)}, not a dict with integer 'tokens' and 'rows'")
        parsed.append(
            SavedSource(
                _int(f"sources[{k}]['tokens']", s["tokens"]),
                _int(f"sources[{k}]['rows']", s["rows"]),
                _word(f"sources[{k}]['content']", s.get("content")),
                _word(f"sources[{k}]['name']", s.get("name"), _NAME_CHARS),
                _word(f"sources[{k}]['layout']", s.get("layout"), _LAYOUT_CHARS),
            )
        )
    n = len(parsed)
    rows = {}
    for key in ("base_rows", "served"):
        v = _list(repr(key), state.get(key), n)
        if not all(_is_int(x) and 0 <= x < MAX_ROWS for x in v):
            bad = next(x for x in v if not (_is_int(x) and 0 <= x < MAX_ROWS))
            raise _bad(f"{key!r} holds {show(bad)}, not a non-negative integer below 2^60")
        rows[key] = tuple(int(x) for x in v)
    shuffle, drop_last = state.get("shuffle"), state.get("drop_last")
    for key, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
        if flag is not None and not isinstance(flag, bool):
            raise _bad(f"{key!r} is {show(flag)}, not True or False")
    epochs = state.get("epochs")
    if epochs is not None:
        epochs = _int("'epochs'", epochs, 1, 2**40)
    return SavedState(
        step=saved,
        saved_step=saved,
        global_batch_size=g,
        seq_len=_int("'seq_len'", state.get("seq_len"), 1, MAX_ROWS),
        seed=_int("'seed'", state.get("seed")),
        mode=_word("'mode'", state.get("mode")),
        shuffle=shuffle,
        epochs=epochs,
        long_docs=_word("'long_docs'", state.get("long_docs")),
        drop_last=drop_last,
        sources=tuple(parsed),
        weights=_weights(_list("'weights'", state.get("weights"), n)),
        base_step=base_step,
        base_rows=rows["base_rows"],
        served=rows["served"],
        rounding=_word("'rounding'", state.get("rounding", "remainder")) or "remainder",
    )


def refuse_other_data(saved: SavedState, config: Any, sources: list[dict[str, Any]]) -> None:
    """An error naming what differs if ``saved`` is for other data or settings than a Loader of
    ``config`` over sources described by ``sources`` (``Source.describe``)."""
    diffs = []
    for key in ("seq_len", "mode", "seed", "shuffle", "epochs", "long_docs", "drop_last"):
        theirs, mine = saved.setting(key), getattr(config, key)
        if theirs != mine:
            diffs.append(f"{key} {show(theirs)} saved, {show(mine)} here")
    if len(saved.sources) != len(sources):
        diffs.append(f"{len(saved.sources)} sources saved, {len(sources)} here")
    else:
        for k, (a, b) in enumerate(zip(saved.sources, sources, strict=True)):
            for key in ("tokens", "rows"):
                if getattr(a, key) != b[key]:
                    diffs.append(f"source {k} has {getattr(a, key)} {key} saved, {b[key]} here")
            if a.layout != b.get("layout") and a.rows == b["rows"]:
                diffs.append(
                    f"source {k} was packed in the bestfit layout {a.layout!r}, here "
                    f"{b.get('layout')!r}"
                )
            if a.content not in (None, b["content"]) and a.rows == b["rows"]:
                diffs.append(  # older states hold no digest: only sizes are compared
                    f"source {k} holds other tokens than the saved one ({show(a.name)}), "
                    "of the same size"
                )
    if diffs:
        shown = diffs[:8] + ([f"{len(diffs) - 8} more"] if len(diffs) > 8 else [])
        raise InvalidInputError(
            "cannot resume: the saved state is for different data or settings ("
            + "; ".join(shown)
            + "); the data order would differ"
        )


def check_reach(mixture: Any, step: int, total: int | None) -> None:
    """Refuse a position whose row counts would leave int64 arithmetic (2^60 rows: far beyond
    any run), or a finite pass (of ``total`` rows) served past its end."""
    if step < 0:
        raise InvalidInputError(f"step must be a non-negative integer, got {show(step)}")
    done = sum(mixture.base_rows)
    rows = done + max(0, step - mixture.base_step) * mixture.global_batch_size
    if step >= MAX_ROWS or rows >= MAX_ROWS:
        raise InvalidInputError(
            f"step {show(step)} is {show(rows)} rows into the data, past the 2^60 rows a "
            "Loader counts; pass a step of a real run"
        )
    if total is not None and done > total:
        raise InvalidInputError(f"the state has served {done} rows of a finite pass of {total}")


# ---- torch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerPosition:
    """One torch dataset's state: DataLoader worker ``worker`` of ``workers`` (0 of 1 without
    workers) yields steps ``next_step, next_step + workers, ...``; ``loader`` is the Loader's
    state where that dataset started."""

    loader: SavedState
    next_step: int
    worker: int
    workers: int


def _is_torchdata(state: dict[str, Any]) -> bool:
    return "_snapshot" in state or ("dataset_state" in state and "_num_yielded" in state)


def _torch_bad(what: str) -> InvalidInputError:
    return InvalidInputError(
        f"not a valid state of a torch DataLoader over Loader.to_torch(): {what}; pass the "
        "dict that StatefulDataLoader.state_dict() returned (unchanged, or through a JSON "
        "round trip), or a Loader.state_dict()"
    )


def parse_worker(state: Any) -> WorkerPosition:
    """One ``to_torch`` dataset's state (bounded and checked, the Loader part included)."""
    if not isinstance(state, dict) or state.get("lmdata_torch") != TORCH_STATE_VERSION:
        raise _torch_bad(f"a dataset state is {show(state)}, not one of Loader.to_torch()")
    loader = state.get("loader")
    if not isinstance(loader, dict):
        raise _torch_bad(f"'loader' is {show(loader)}, not a Loader state")
    first = _parse_loader(loader)
    workers = state.get("num_workers")
    if not _is_int(workers) or not 1 <= workers <= _MAX_WORKERS:
        raise _torch_bad(f"'num_workers' is {show(workers)}, not 1 to {_MAX_WORKERS}")
    worker = state.get("worker")
    if not _is_int(worker) or not 0 <= worker < workers:
        raise _torch_bad(f"'worker' is {show(worker)}, not a worker of {workers}")
    nxt = state.get("next_step")
    if not _is_int(nxt) or not first.step <= nxt < MAX_ROWS:
        raise _torch_bad(f"'next_step' is {show(nxt)}, not a step from {first.step} on")
    return WorkerPosition(first, int(nxt), int(worker), int(workers))


def _parse_torch(state: dict[str, Any]) -> SavedState:
    """The global position a torch state holds: the step after the last batch the training
    received (the workers' positions are interleaved: worker ``i`` of ``k`` yields every
    ``k``-th step, and the one whose turn is next has not yielded it)."""
    snap = state.get("_snapshot")
    if snap is None:  # one dataset's own state, or a StatefulDataLoader's without workers
        pos = parse_worker(state if "lmdata_torch" in state else state.get("dataset_state"))
        if pos.workers != 1:
            raise _torch_bad(
                f"this is worker {pos.worker} of {pos.workers} alone, which does not say where "
                "the others are; pass the StatefulDataLoader's whole state_dict()"
            )
        return replace(pos.loader, step=pos.next_step)
    snap = _dict("'_snapshot'", snap)
    workers = _dict("'_worker_snapshots'", snap.get("_worker_snapshots"))
    if not 1 <= len(workers) <= _MAX_WORKERS:
        raise _torch_bad(f"'_worker_snapshots' is {show(workers)}, not 1 to {_MAX_WORKERS}")
    positions = []
    for key, w in workers.items():
        w = _dict(f"worker snapshot {show(key)}", w)
        positions.append(parse_worker(w.get("dataset_state")))
    k = len(positions)
    if sorted(p.worker for p in positions) != list(range(k)) or any(
        p.workers != k for p in positions
    ):
        raise _torch_bad(f"the {k} worker states are not workers 0 to {k - 1} of {k}")
    if any(p.loader != positions[0].loader for p in positions):
        raise _torch_bad("the workers started from different Loader states")
    since = state.get("_steps_since_snapshot", 0)
    if not _is_int(since) or not 0 <= since < MAX_ROWS:
        raise _torch_bad(f"'_steps_since_snapshot' is {show(since)}, not a count of steps")
    step = min(p.next_step for p in positions) + since
    return replace(positions[0].loader, step=min(step, MAX_ROWS - 1))


def _dict(where: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _torch_bad(f"{where} is {show(v)}, not a dict")
    return v
