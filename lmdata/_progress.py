"""Progress of long work as one event type: every long verb (tokenize, convert, merge, validate,
info, the Dolma toolkit, manifest, stats, index) takes ``progress=``, a callable that receives
frozen :class:`Progress` events. The library never draws: the CLI turns the events into a bar
on a terminal and plain lines in a log (:mod:`lmdata.cli._progress`), and a caller of the API
does what it likes with them (log them, feed its own bar, stop a job by raising).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Unit = Literal["bytes", "records", "documents", "tokens", "files"]


@dataclass(frozen=True)
class Progress:
    """How far one phase of a long verb got: ``done`` of ``total`` (None: not known ahead)
    ``unit``s, in the phase named ``what`` (``"validate"``, ``"dedupe: hash"``).

    Within one ``what`` and ``unit``, ``done`` never decreases and never passes ``total``; the
    first event of a phase with a known total has ``done=0`` and announces it, and a phase that
    got to its end reports ``done == total``. A verb that counts several units at once
    (tokenize: bytes read, documents, tokens) sends one event per unit, the one with the
    total first. Events come a few per shard, chunk, file or MiB, never one per record."""

    done: int
    total: int | None
    unit: Unit
    what: str

    @property
    def fraction(self) -> float | None:
        """``done / total``, or None when the total is not known (or is 0)."""
        return self.done / self.total if self.total else None


OnProgress = Callable[[Progress], None]
"""What a verb's ``progress=`` takes: called with each :class:`Progress` event, in the
calling thread (raising from it stops the verb as any error does)."""


class Ticker:
    """Reports a phase to an optional :data:`OnProgress`: the total on creation, then the work
    added; ``done`` is clamped to ``[previous, total]`` so the events stay monotonic even when
    the data disagree with the sizes the total was taken from."""

    __slots__ = ("done", "progress", "total", "unit", "what")

    def __init__(
        self, progress: OnProgress | None, total: int, what: str, unit: Unit = "bytes"
    ) -> None:
        self.progress, self.total, self.done = progress, max(0, int(total)), 0
        self.what, self.unit = what, unit
        if progress is not None:
            progress(Progress(0, self.total, unit, what))

    def add(self, n: int) -> None:
        """``n`` more done."""
        self.to(self.done + n)

    def to(self, done: int) -> None:
        """``done`` in all (a smaller number than reported before is ignored)."""
        done = min(self.total, int(done))
        if done > self.done:
            self.done = done
            if self.progress is not None:
                self.progress(Progress(done, self.total, self.unit, self.what))

    def finish(self) -> None:
        """The walk got to the end: all of ``total`` done."""
        self.to(self.total)


class Counter:
    """Counts a phase whose total is not known ahead (documents of a Dolma job, reported by
    its workers as increments) and reports the running count to an optional
    :data:`OnProgress`."""

    __slots__ = ("done", "progress", "unit", "what")

    def __init__(self, progress: OnProgress | None, what: str, unit: Unit = "documents") -> None:
        self.progress, self.what, self.unit, self.done = progress, what, unit, 0

    def add(self, n: int) -> None:
        """``n`` more done (increments of 0 or less report nothing)."""
        if n > 0:
            self.done += n
            if self.progress is not None:
                self.progress(Progress(self.done, None, self.unit, self.what))


def relabelled(
    progress: OnProgress | None, what: str, by: int = 0, total: int | None = None
) -> OnProgress | None:
    """``progress`` for a part of a phase named ``what``: its events' ``done`` moved on by
    ``by`` and, given ``total``, their total made ``total`` (a check that hashes files after
    reading them reports both as one walk)."""
    if progress is None:
        return None

    def moved(e: Progress) -> None:
        whole = e.total if total is None else total
        done = by + e.done if whole is None else min(by + e.done, whole)
        progress(Progress(done, whole, e.unit, what))

    return moved


def accepted(progress: OnProgress | bool | None) -> OnProgress | None:
    """``progress=`` as a verb takes it: a callable, or None. The Dolma verbs took a bool
    (True: the library drew a bar); a bool still works, with a DeprecationWarning, and draws
    nothing (the CLI draws; pass a callable to see the events)."""
    if isinstance(progress, bool):
        warnings.warn(
            "progress=True/False is deprecated and draws nothing: pass a callable that "
            "receives lmdata.Progress events, or None",
            DeprecationWarning,
            stacklevel=3,
        )
        return None
    if progress is not None and not callable(progress):
        from lmdata.errors import InvalidInputError

        raise InvalidInputError(
            f"progress= takes a callable receiving lmdata.Progress events, not a "
            f"{type(progress).__name__}"
        )
    return progress
