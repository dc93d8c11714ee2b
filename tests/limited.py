"""Run a test helper in a child Python under CPU-time and address-space limits: a runaway (a
huge computation or allocation on hostile input) is stopped there (SIGXCPU, MemoryError) and
reported as a failure, never loading the test machine. The limits are resources, not timings:
a loaded machine slows the child's clock, not its CPU seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_limited(
    module: str,
    func: str,
    arg: Any,
    *,
    cpu_seconds: int = 120,
    address_space: int = 4 << 30,
) -> Any:
    """``module.func(arg)`` in a child with the limits; its JSON-able result."""
    code = (
        "import importlib, json, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_CPU, ({cpu_seconds}, {cpu_seconds + 10}))\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
        f"f = getattr(importlib.import_module({module!r}), {func!r})\n"
        "print(json.dumps(f(json.loads(sys.argv[1]))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(arg)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30 * cpu_seconds,  # a hang guard only: the CPU limit ends a runaway first
    )
    assert out.returncode == 0, (
        f"the child ended with {out.returncode} (a negative number is the signal that "
        f"stopped it, e.g. -24 SIGXCPU: its CPU limit): {out.stderr[-3000:]}"
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
