"""Stopping a Dolma job between units, and counting the units it runs (for the resume tests):
the engine is in-process, so the job runs the module's unit function as patched here."""

from __future__ import annotations

from typing import Any

import pytest


class Killed(Exception):
    """Stands for a kill of the job between two units."""


def counting(mp: pytest.MonkeyPatch, module: Any, name: str, stop_after: int | None = None) -> list:
    """Wrap ``module.name`` (a unit function) to record each unit it runs, and to stop the job
    (``Killed``) once ``stop_after`` units have run."""
    real = getattr(module, name)
    ran: list = []

    def unit(task: Any) -> Any:
        if stop_after is not None and len(ran) == stop_after:
            raise Killed
        ran.append(task)
        return real(task)

    mp.setattr(module, name, unit)
    return ran
