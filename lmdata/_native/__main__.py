"""``python -m lmdata._native``: which C extensions lmdata uses, and what runs without the rest
(``make install`` prints it after building)."""

from __future__ import annotations

from lmdata._native import report

if __name__ == "__main__":
    print(report())
