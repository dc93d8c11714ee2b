"""The CLI's progress display: :class:`lmdata.Progress` events drawn as a tqdm bar on a
terminal, and as a plain line every few seconds when stderr is a log file or a pipe (a cluster
job), so the log shows how far it got. Only the CLI draws; the library sends events.

:func:`shown` gives the ``progress=`` callable a CLI verb passes to the library: one bar per
phase (``what``), the previous one closed when the next phase starts; the events of other
units of the same phase (tokenize's documents and tokens beside its bytes) are counts beside
the bar. ``bar(...)`` is the bar itself, with tqdm's small interface (``update``, ``n``,
``total``, ``set_postfix_str``, ``format_dict``, ``close``, context manager). The interval of
the plain lines is ``LMDATA_PROGRESS_INTERVAL`` seconds (default 5).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from lmdata._progress import OnProgress, Progress

DEFAULT_INTERVAL = 5.0


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("LMDATA_PROGRESS_INTERVAL", DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _amount(n: float, unit: str, scale: bool) -> str:
    if scale:
        for prefix in ("", "k", "M", "G", "T"):
            if abs(n) < 1000 or prefix == "T":
                return f"{n:.0f} {unit}" if not prefix else f"{n:.1f} {prefix}{unit}"
            n /= 1000
    return f"{n:,.0f} {unit}"


class LogLines:
    """tqdm's interface, printing ``desc: done of total (pct), rate, ETA | postfix`` lines."""

    def __init__(
        self,
        total: float | None = None,
        unit: str = "it",
        desc: str = "",
        unit_scale: bool = False,
        file: TextIO | None = None,
        interval: float | None = None,
        leave: bool = True,
    ) -> None:
        self.total = total
        self.leave = leave  # False: no closing line for work done before the first line
        self.n: float = 0
        self.unit = unit.strip() or "it"
        self.desc = desc
        self.unit_scale = unit_scale
        self.postfix = ""
        self._file = file
        self._interval = _interval() if interval is None else interval
        self._start = time.monotonic()
        self._last = self._start
        self._closed = False
        self._printed = False

    @property
    def format_dict(self) -> dict[str, Any]:
        return {"elapsed": time.monotonic() - self._start, "n": self.n, "total": self.total}

    def _line(self, final: bool = False) -> str:
        elapsed = time.monotonic() - self._start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        done = _amount(self.n, self.unit, self.unit_scale)
        parts = [f"{self.desc}: " if self.desc else ""]
        if final:
            parts.append(f"done, {done} in {_duration(elapsed)}")
        elif self.total:
            pct = 100 * self.n / self.total
            parts.append(
                f"{done} of {_amount(self.total, self.unit, self.unit_scale)} ({pct:.0f}%)"
            )
        else:
            parts.append(done)
        parts.append(f", {_amount(rate, self.unit, self.unit_scale)}/s")
        if not final and self.total and rate > 0:
            parts.append(f", ETA {_duration(max(0.0, self.total - self.n) / rate)}")
        if self.postfix:
            parts.append(f" | {self.postfix}")
        return "".join(parts)

    def _emit(self, final: bool = False) -> None:
        f = self._file or sys.stderr
        f.write(self._line(final) + "\n")
        f.flush()
        self._printed = True

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            self._emit()

    def update(self, n: float = 1) -> None:
        self.n += n
        self.refresh()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.n and (self.leave or self._printed):
                self._emit(final=True)

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bar(
    total: float | None = None,
    unit: str = "it",
    desc: str = "",
    quiet: bool = False,
    unit_scale: bool = False,
    disable: bool = False,
    leave: bool = True,
    **tqdm_options: Any,
) -> Any:
    """A progress bar for a terminal, plain lines for anything else, nothing when ``quiet``
    (or ``disable``, tqdm's name, for work too small to report). ``leave=False``: the bar
    goes when closed, and plain lines end with no summary unless progress lines came first
    (quick work leaves the log clean)."""
    from tqdm import tqdm

    if quiet or disable:
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        tqdm_options.setdefault("dynamic_ncols", True)
        return tqdm(
            total=total, unit=unit, desc=desc, unit_scale=unit_scale, leave=leave, **tqdm_options
        )
    return LogLines(total=total, unit=unit, desc=desc, unit_scale=unit_scale, leave=leave)


# how each unit is shown: (tqdm's unit, scaled with k/M/G prefixes)
_SHOWN = {
    "bytes": ("B", True),
    "records": ("rec", False),
    "documents": ("docs", False),
    "tokens": ("tok", True),
    "files": ("files", False),
}


class Bars:
    """Draws :class:`Progress` events: a bar per phase, the phase's first unit on the bar and
    its other units as counts (and rates) after it. ``leave=False``: bars go when closed, and
    plain lines end with no summary unless lines came first (quick work leaves the log
    clean); ``delay``: seconds before a terminal bar shows."""

    def __init__(self, leave: bool = True, delay: float = 0.0) -> None:
        self.leave, self.delay = leave, delay
        self.what: str | None = None
        self.unit: str | None = None
        self.bar: Any = None
        self.counts: dict[str, int] = {}

    def __call__(self, e: Progress) -> None:
        if e.what != self.what:
            self.close()
            self.what, self.unit, self.counts = e.what, e.unit, {}
            unit, scale = _SHOWN.get(e.unit, (e.unit, False))
            options = {"delay": self.delay} if self.delay else {}
            self.bar = bar(
                total=e.total, unit=unit, unit_scale=scale, desc=e.what, leave=self.leave, **options
            )
        b = self.bar
        if e.unit != self.unit:
            self.counts[e.unit] = e.done
            elapsed = b.format_dict["elapsed"] or 1e-9
            b.set_postfix_str(
                ", ".join(
                    f"{n:,} {u} ({n / elapsed:,.0f} {_SHOWN.get(u, (u,))[0]}/s)"
                    for u, n in self.counts.items()
                ),
                refresh=False,
            )
            return
        if e.total is not None and b.total != e.total:
            b.total = e.total
        b.update(e.done - b.n)

    def close(self, failed: bool = False) -> None:
        """End the current bar; ``failed``: a log gets no "done" line for work that failed."""
        if self.bar is not None:
            if failed and isinstance(self.bar, LogLines):
                self.bar._closed = True
            self.bar.close()
        self.bar = self.what = self.unit = None


@contextlib.contextmanager
def shown(
    quiet: bool = False, *, leave: bool = True, delay: float = 0.0
) -> Iterator[OnProgress | None]:
    """The ``progress=`` callable of a CLI verb, drawing on stderr (see :class:`Bars`), or
    None when ``quiet`` (verbs then skip what they do only to report, such as listing file
    sizes). The bar closes when the block ends; after an error, a log gets no "done" line."""
    if quiet:
        yield None
        return
    bars = Bars(leave=leave, delay=delay)
    try:
        yield bars
    except BaseException:
        bars.close(failed=True)
        raise
    bars.close()
