"""Where bytes live: one ``Store`` protocol under every reader and writer, and one byte cache.

- :func:`resolve` turns a local path or a URL into ``(store, key)``: :class:`LocalStore`
  (``pread``, ``mmap``, rename commits) or :class:`FsspecStore` (``memory://``, ``s3://``,
  ``gs://``: ranged reads, metadata-last commits). A scheme lmdata cannot serve is an error.
  Code outside this package asks the :class:`Store` protocol (``local_path``, ``identity``,
  ``put``, ``read_many``, ``copy_tree``, ``get_tree``, ``usage``, ``refresh``, and outputs
  built locally or staged), never a store's type or filesystem (``tests/test_seams.py``).
- :data:`CACHE` holds decoded bytes for every reader of the process within one budget
  (``LMDATA_CACHE_BYTES``, :func:`set_cache_bytes`); each reader takes a :class:`Slot`, and
  each object store one for the byte ranges it fetched (:mod:`lmdata.storage.ranges`).
- :func:`clean` removes what killed writers left (``.lmdata-tmp-*``, stale claims).
- :func:`manifest_output` is the output every format writer writes through: it hashes what
  passes (xxh3-128, per 4 MiB block) and writes the dataset's manifest last
  (:mod:`lmdata.storage.manifest`); :mod:`lmdata.storage.manifest_check` checks a dataset
  against it.
- The path-level helpers (:class:`AtomicOutput`, :func:`atomic_dir`, :func:`check_output`,
  ...) serve the writers and tools that still write local files only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmdata.storage.base import (
    MAX_READ_BYTES,
    Output,
    Store,
    Usage,
    basename,
    join,
    parent,
    shown,
)
from lmdata.storage.cache import CACHE, ByteCache, Slot, cache_bytes, new_slot, set_cache_bytes
from lmdata.storage.clean import Leftover, clean, find_leftovers, parse_age
from lmdata.storage.fsspec import FsspecStore
from lmdata.storage.fsspec_output import FsspecOutput
from lmdata.storage.local import LocalOutput, LocalStore
from lmdata.storage.manifest_output import LocalTree, ManifestOutput
from lmdata.storage.manifest_output import output as manifest_output
from lmdata.storage.paths import (
    TMP_PREFIX,
    AtomicOutput,
    AtomicWriter,
    atomic_dir,
    atomic_file,
    check_output,
    commit,
)
from lmdata.storage.urls import (
    apparent_size,
    check_dest,
    disk_usage,
    is_url,
    local_path,
    options_scope,
    require_exists,
    resolve,
    scheme,
    usage,
)

__all__ = [
    "CACHE",
    "MAX_READ_BYTES",
    "TMP_PREFIX",
    "AtomicOutput",
    "AtomicWriter",
    "ByteCache",
    "FsspecOutput",
    "FsspecStore",
    "Leftover",
    "LocalOutput",
    "LocalStore",
    "LocalTree",
    "ManifestOutput",
    "Output",
    "Slot",
    "Store",
    "Usage",
    "apparent_size",
    "atomic_dir",
    "atomic_file",
    "basename",
    "cache_bytes",
    "check_dest",
    "check_output",
    "clean",
    "commit",
    "disk_usage",
    "find_leftovers",
    "is_url",
    "join",
    "local_path",
    "manifest_output",
    "new_slot",
    "options_scope",
    "parent",
    "parse_age",
    "require_exists",
    "resolve",
    "scheme",
    "set_cache_bytes",
    "shown",
    "usage",
]


if TYPE_CHECKING:  # checked statically: every store and output satisfies its protocol
    from lmdata.storage.spool import SpooledOutput

    def _conforms(
        a: LocalStore, b: FsspecStore, c: LocalOutput, d: FsspecOutput, e: SpooledOutput
    ) -> tuple[Store, Store, Output, Output, Output]:
        return a, b, c, d, e
