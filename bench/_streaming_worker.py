"""Run inside the mosaicml-streaming venv: time `ds[i]` over given indices or one iteration.

Prints {"seconds": ..., "digest": ...}; the digest hashes every decoded sample the same way
bench_origin_reads.digest does, so the two columns are checked equal before a time counts.
With ``{"op": "serve", ...}`` it opens the dataset once and then times one request per line
of stdin (``{"op": "random", "idx": [...]}`` or ``{"op": "iter"}``), answering each with one
line, so a benchmark can interleave lmdata and streaming runs without paying streaming's
import and open per run.
"""

import hashlib
import json
import os
import sys
import time

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "formats")
)
# the torchvision/transformers stand-ins, and shared-memory names of this process's own (a
# test run or another benchmark using streaming at the same time cannot take or unlink them)
import mds_streaming_helper
import numpy as np


def feed(h, s):
    for k in sorted(s):
        v = s[k]
        if isinstance(v, np.ndarray):
            h.update(k.encode() + v.dtype.str.encode() + v.tobytes())
        else:
            h.update(k.encode() + repr(v).encode())


def run(ds, job):
    h = hashlib.sha256()
    t = time.perf_counter()
    if job["op"] == "random":
        out = [ds[i] for i in job["idx"]]
    else:
        out = list(ds)
    dt = time.perf_counter() - t
    for s in out:
        feed(h, s)
    return {"seconds": dt, "digest": h.hexdigest()}


job = json.loads(sys.argv[1])
ds = mds_streaming_helper.open_dataset(
    local=job["local"], shuffle=False, batch_size=job.get("batch_size", 256)
)
if job["op"] == "serve":
    print(json.dumps({"ready": ds.size}), flush=True)
    for line in sys.stdin:
        print(json.dumps(run(ds, json.loads(line))), flush=True)
else:
    print(json.dumps(run(ds, job)))
