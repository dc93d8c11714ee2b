"""Outputs written in pieces by several units (tag's byte ranges, mix's shard pieces), and the
joining of the pieces into the output, in input order.

A piece is written beside its output in a hidden ``.lmdata-tmp-parts/`` folder (listings of a tree
skip it). Joining copies the pieces' compressed bytes into the output (see
:func:`lmdata.formats.dolma._output.join_parts`): on a local path the driver does it (a file
copy); on an object store the joins run as units of the job's executor, so the bytes go from
store to store through the workers, never through the driver.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmdata import parallel
from lmdata.formats.dolma._output import join_parts
from lmdata.storage import LocalStore, basename, join, parent, resolve
from lmdata.storage.paths import TMP_PREFIX

PARTS = f"{TMP_PREFIX}parts"  # a staged-output name, so `lmdata clean` finds what a killed job left


def part_key(output: str, piece: int) -> str:
    """Where piece ``piece`` of ``output`` (a key or URL) is written before the join."""
    return join(parent(output), PARTS, f"{basename(output)}.{piece:06d}")


@dataclass(frozen=True)
class Join:
    """Join the pieces of ``output`` (a path or URL; one per entry of ``checksums``: the CRC-32
    and length of its uncompressed bytes) written with ``compression``."""

    output: str
    compression: str
    checksums: tuple[tuple[int, int], ...]
    storage_options: dict[str, Any] | None = None
    overwrite: bool = True


def run_join(j: Join) -> int:
    store, key = resolve(j.output, j.storage_options)
    keys = [part_key(key, k) for k in range(len(j.checksums))]
    join_parts(store, key, j.compression, keys, j.checksums, overwrite=j.overwrite)
    if isinstance(store, LocalStore):
        try:  # the last join of a folder leaves no empty parts folder behind for `lmdata clean`
            os.rmdir(parent(keys[0]))
        except OSError:
            pass  # other outputs' pieces are still there
    return len(keys)


def join_all(joins: Sequence[Join], engine: str, workers: int | None, address: str | None) -> None:
    """Run every join: local outputs here, object-store outputs on the executor's workers."""
    remote = []
    for j in joins:
        store, _ = resolve(j.output, j.storage_options)
        if isinstance(store, LocalStore):
            run_join(j)
        else:
            remote.append(j)
    if remote:
        parallel.run_all(
            run_join,
            remote,
            engine=engine,
            workers=workers or 1,
            address=address,
            desc="join",
            progress=False,
        )
