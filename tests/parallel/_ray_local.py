"""One local Ray instance per test module (each start costs seconds), for the Ray tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def started_ray() -> Iterator[Any]:
    """Start a new local Ray (2 CPUs) and shut it down after; yields the ``ray`` module."""
    import ray

    # address="local": a new instance, never a cluster a stale /tmp/ray file points at
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
