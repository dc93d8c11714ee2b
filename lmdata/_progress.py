"""Progress for long work, in one place: a tqdm bar on a terminal, and a plain line every few
seconds when stderr is a log file or a pipe (a cluster job), so the log shows how far it got.

``bar(...)`` returns an object with tqdm's small interface (``update``, ``n``, ``total``,
``set_postfix_str``, ``format_dict``, ``close``, context manager). ``quiet=True`` silences it.
The interval of the plain lines is ``LMDATA_PROGRESS_INTERVAL`` seconds (default 5).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

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
    ) -> None:
        self.total = total
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
            if self.n:
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
    **tqdm_options: Any,
) -> Any:
    """A progress bar for a terminal, plain lines for anything else, nothing when ``quiet``
    (or ``disable``, tqdm's name, for work too small to report)."""
    from tqdm import tqdm

    if quiet or disable:
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        tqdm_options.setdefault("dynamic_ncols", True)
        return tqdm(total=total, unit=unit, desc=desc, unit_scale=unit_scale, **tqdm_options)
    return LogLines(total=total, unit=unit, desc=desc, unit_scale=unit_scale)
