"""Looking inside datasets: decoding token ids, statistics, and what the viewer shows."""

from __future__ import annotations

from lmdata.inspect.decode import decode, pieces

__all__ = ["decode", "pieces"]
