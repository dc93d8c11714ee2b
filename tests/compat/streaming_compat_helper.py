"""Runs mosaicml-streaming 0.13.0 for the drop-in tests (its own venv, see mds_streaming_helper).

Usage: python streaming_compat_helper.py '<json job>'. Jobs: ``resume`` (iterate, save the
state after k samples, resume a fresh dataset from it), ``epochs`` (the whole sample order of
epochs for given worlds, from streaming's own ``generate_work``) and ``iterate`` (the ids a
single process iterates, epoch after epoch, and after resuming).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "formats")
)

import mds_streaming_helper  # installs the torchvision/transformers stand-ins
from streaming import Stream, StreamingDataset
from streaming.base.batching import generate_work
from streaming.base.world import World


def resume(job: dict) -> dict:
    ds = mds_streaming_helper.open_dataset(local=job["local"], batch_size=job["batch_size"])
    it = iter(ds)
    first = [next(it)["id"] for _ in range(job["k"])]
    state = ds.state_dict(job["k"], False)
    del it
    ds2 = mds_streaming_helper.open_dataset(local=job["local"], batch_size=job["batch_size"])
    ds2.load_state_dict(state)
    rest = [s["id"] for s in ds2]
    return {"first": first, "state": state, "rest": rest, "len": len(ds), "size": ds.size}


def _dataset(job: dict) -> StreamingDataset:
    kw = dict(job.get("kwargs", {}))
    if "streams" in job:
        kw["streams"] = [Stream(**s) for s in job["streams"]]
    else:
        kw["local"] = job["local"]
    return mds_streaming_helper.open_dataset(**kw)


def epochs(job: dict) -> dict:
    """For each case: streaming's whole-epoch array of sample ids for a world."""
    out = []
    for case in job["cases"]:
        ds = _dataset(case)
        nodes, ranks, workers = case["world"]
        if ds.num_canonical_nodes is None:
            ds.num_canonical_nodes = nodes
        ds._set_shuffle_block_size(World(nodes, ranks, workers, 0))
        ds.initial_physical_nodes = case.get("initial_nodes")
        ids = generate_work(ds.batching_method, ds, World(nodes, ranks, workers, 0),
                            case["epoch"], case.get("sample_in_epoch", 0))  # fmt: skip
        out.append({"ids": ids.tolist(), "len": len(ds), "epoch_size": int(ds.epoch_size)})
        del ds
    return {"cases": out}


def iterate(job: dict) -> dict:
    """Ids over two epochs, then a fresh dataset resumed after k samples of epoch 0."""
    ds = _dataset(job)
    runs = [[int(s["id"]) for s in ds] for _ in range(2)]
    del ds
    ds = _dataset(job)
    it = iter(ds)
    first = [next(it) for _ in range(job["k"])]
    state = ds.state_dict(len(first), False)
    del it, ds
    ds = _dataset(job)
    ds.load_state_dict(state)
    rest = [int(s["id"]) for s in ds]
    return {"epochs": runs, "state": state, "rest": rest}


def batch(job: dict) -> dict:
    return {"results": [OPS[j["op"]](j) for j in job["jobs"]]}


OPS = {"resume": resume, "epochs": epochs, "iterate": iterate, "batch": batch}

if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    print(json.dumps(OPS[job["op"]](job)))
