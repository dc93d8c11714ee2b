"""Runs mosaicml-streaming 0.13.0 for the drop-in tests (its own venv, see mds_streaming_helper).

Usage: python streaming_compat_helper.py '<json job>'. Jobs: ``resume`` (iterate, save the
state after k samples, resume a fresh dataset from it) and ``write_example`` (the README's
MDSWriter example with seeded samples).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "formats")
)

import mds_streaming_helper  # noqa: F401  (installs the torchvision/transformers stand-ins)
from streaming import StreamingDataset
from streaming.base.util import clean_stale_shared_memory


def resume(job: dict) -> dict:
    clean_stale_shared_memory()
    ds = StreamingDataset(local=job["local"], batch_size=job["batch_size"])
    it = iter(ds)
    first = [next(it)["id"] for _ in range(job["k"])]
    state = ds.state_dict(job["k"], False)
    del it
    clean_stale_shared_memory()
    ds2 = StreamingDataset(local=job["local"], batch_size=job["batch_size"])
    ds2.load_state_dict(state)
    rest = [s["id"] for s in ds2]
    return {"first": first, "state": state, "rest": rest, "len": len(ds), "size": ds.size}


OPS = {"resume": resume}

if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    print(json.dumps(OPS[job["op"]](job)))
