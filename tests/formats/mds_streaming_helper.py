"""Runs mosaicml-streaming 0.13.0 for the MDS interop tests and benchmarks (its own venv).

Usage: python mds_streaming_helper.py '<json job>' -- prints one JSON line or writes a pickle.
Jobs: write (streaming's writers), read (StreamingDataset random access and iteration,
canonicalised into a pickle), merge (streaming's merge_index), bench (timings), names (the
shared-memory names a StreamingDataset of this process creates).

streaming names its shared memory (``/dev/shm``) and file locks (the temp dir) ``000000_locals``,
``000001_locals``, ... machine-wide, picks the first free number by looking at what exists, and
``clean_stale_shared_memory`` unlinks every such name, including those of a streaming process
running beside it: two test runs (or a test and a benchmark) at once broke each other. Importing
this module gives the process names of its own (:func:`private_names`), so its datasets and its
clean-up touch only what this process created.

streaming imports torchvision and transformers at import time for features these tests never
use: the stand-ins of streaming_standins.py replace both (transformers is installed in that
venv but takes seconds to import).
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


from streaming_standins import install

install(transformers=True)
os.environ.setdefault("TQDM_DISABLE", "1")

from mds_samples import canonical, columns, samples  # noqa: E402
from streaming import CSVWriter, JSONWriter, MDSWriter, StreamingDataset, TSVWriter  # noqa: E402
from streaming.base.format.xsv import XSVWriter  # noqa: E402
from streaming.base.util import clean_stale_shared_memory, merge_index  # noqa: E402

# the modules that name shared memory and file locks with streaming's ``_get_path``
_NAMING_MODULES = (
    "streaming.base.shared.prefix",
    "streaming.base.shared",
    "streaming.base.dataset",
    "streaming.base.util",
)
TAG = f"lmd{os.getpid()}{uuid.uuid4().hex[:8]}"  # this process's names start with it


def private_names(tag: str = TAG) -> None:
    """Make streaming name everything of this process ``{tag}_{number}_{what}`` (the number
    counts from 0 among this process's datasets) and clean up only those names at exit."""

    def get_path(prefix_int: int, name: str) -> str:
        return f"{tag}_{prefix_int:06}_{name}"

    for name in _NAMING_MODULES:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "_get_path"):
            module._get_path = get_path  # type: ignore[attr-defined]
    atexit.register(clean_stale_shared_memory)  # now: only this process's names


private_names()


def write(job: dict) -> dict:
    fmt = job.get("format", "mds")
    cls = {
        "mds": MDSWriter,
        "csv": CSVWriter,
        "tsv": TSVWriter,
        "json": JSONWriter,
        "xsv": XSVWriter,
    }[fmt]
    kw = {
        "columns": columns(job["recipe"]),
        "out": job["out"],
        "compression": job.get("compression"),
        "hashes": job.get("hashes"),
        "size_limit": job.get("size_limit", 1 << 26),
    }
    if fmt == "xsv":
        kw["separator"] = job.get("separator", "|")
    rows = samples(job["recipe"], job["n"])
    t = time.perf_counter()
    with cls(**kw) as w:
        for s in rows:
            w.write(s)
    return {"ok": True, "seconds": time.perf_counter() - t}


def open_dataset(**kw: object) -> StreamingDataset:
    """A StreamingDataset in this process's own shared-memory names (see :func:`private_names`;
    streaming picks numbers by looking at what exists, so no other process can take them)."""
    clean_stale_shared_memory()  # what an earlier dataset of this process left
    return StreamingDataset(**kw)


def _dataset(job: dict) -> StreamingDataset:
    return open_dataset(
        local=job["local"],
        split=job.get("split"),
        shuffle=False,
        batch_size=job.get("batch_size", 1),
        allow_unsafe_types=job.get("unsafe", False),
    )


def read(job: dict) -> dict:
    ds = _dataset(job)
    n = ds.size
    picks = job.get("indices") or list(range(n))
    at = [canonical(ds[i]) for i in picks]
    iterated = [canonical(s) for s in ds] if job.get("iterate", True) else None
    with open(job["result"], "wb") as f:
        pickle.dump({"size": n, "random": at, "iterated": iterated}, f)
    return {"ok": True, "size": n}


def merge(job: dict) -> dict:
    merge_index(job["root"], keep_local=True)
    return {"ok": True}


def bench(job: dict) -> dict:
    import numpy as np

    ds = _dataset(job)
    n = ds.size
    rng = np.random.default_rng(0)
    idx = rng.integers(0, n, job["random"]).tolist()
    t = time.perf_counter()  # iterate first: it also decompresses every shard (warm cache)
    count = 0
    for _ in ds:
        count += 1
    iter_s = time.perf_counter() - t
    random_s = float("inf")
    for _ in range(job.get("repeat", 3)):  # best of: the machine is shared
        t = time.perf_counter()
        for i in idx:
            ds[i]
        random_s = min(random_s, time.perf_counter() - t)
    return {"random_per_s": len(idx) / random_s, "iter_per_s": count / iter_s, "n": count}


def names(job: dict) -> dict:
    """The shared-memory names and temp-dir locks that exist while a dataset is open (this
    process's tag picks them out), and the tag."""
    import tempfile

    ds = _dataset(job)
    ds[0]
    shm = sorted(n for n in os.listdir("/dev/shm") if TAG in n)
    locks = sorted(n for n in os.listdir(tempfile.gettempdir()) if TAG in n)
    prefix = ds._shm_prefix_int
    return {"tag": TAG, "shm": shm, "locks": locks, "prefix": prefix}


def copy(job: dict) -> dict:
    """A copy of a folder (streaming decompresses beside the shards it reads: it reads copies
    of datasets the test reads too)."""
    import shutil

    shutil.copytree(job["src"], job["dst"])
    return {"ok": True}


def batch(job: dict) -> dict:
    """Several jobs in one process: importing torch and streaming takes seconds."""
    return {"results": [OPS[j["op"]](j) for j in job["jobs"]]}


OPS = {
    "write": write,
    "read": read,
    "merge": merge,
    "bench": bench,
    "names": names,
    "copy": copy,
    "batch": batch,
}

if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    print(json.dumps(OPS[job["op"]](job)))
