"""Collecting ``validate`` problems: every kind reported up to a limit, the rest counted."""

from __future__ import annotations

MAX_REPORTED = 20  # per kind of problem; the rest are counted in one line


class ProblemReport:
    """``add(kind, message)`` for each problem; ``finish()`` returns the report lines.

    The one report type of every format's ``validate``: at most ``max_reported`` messages per
    kind are kept, the rest of that kind are counted in one line.
    """

    def __init__(self, max_reported: int = MAX_REPORTED) -> None:
        self.problems: list[str] = []
        self._counts: dict[str, int] = {}
        self._max = max_reported

    def add(self, kind: str, msg: str) -> None:
        n = self._counts[kind] = self._counts.get(kind, 0) + 1
        if n <= self._max:
            self.problems.append(msg)

    def count(self, kind: str, n: int) -> None:
        """Count ``n`` more problems of ``kind`` without messages (beyond those added)."""
        self._counts[kind] = self._counts.get(kind, 0) + n

    def finish(self) -> list[str]:
        """The report lines: every listed problem, then one count line per kind over the cap."""
        for kind, n in self._counts.items():
            if n > self._max:
                self.problems.append(overflow_line(kind, n - self._max))
        return self.problems


def overflow_line(kind: str, n: int) -> str:
    """The one wording of "and N more" every validate uses."""
    return f"{kind}: {n} more problems like the above (not listed)"
