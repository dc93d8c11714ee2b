"""Run inside a zarr-python venv (2 or 3): time packed-row reads of one flat-tokens store.

``python _zarr_worker.py '{"store": ..., "batches": ..., "seq": 2048}'`` opens the store's
``train/encoded_tokens`` with zarr-python (as seqax's loader does: ``zarr.open_group(path,
mode="r")``), loads the random batches of row numbers (an .npy file of shape (k, batch)), prints
``{"ready": zarr version}`` and then times one request per line of stdin, answering each with
``{"seconds": ..., "digest": ...}``:

- ``{"op": "random", "n": k}``: the first k batches; row ``r`` is tokens ``r*seq:(r+1)*seq``
  (packed across documents, no padding: lmdata's ``packed_rows``), read as one ``oindex``
  selection of the batch's token positions, reshaped to (batch, seq), every batch kept;
- ``{"op": "seq", "rows": n, "block": b}``: rows 0..n-1 in order, ``b`` rows a slice (seqax's
  read block), each block reshaped to (b, seq).

The digest is sha256 over the returned arrays' bytes in order, as bench_origin_reads hashes
lmdata's, so the two columns are checked equal before a time counts. Only the reads are timed.
"""

import hashlib
import json
import sys
import time

import numpy as np
import zarr


def random_rows(arr, batches, seq):
    # one orthogonal selection of the batch's token positions: zarr reads each chunk it
    # touches once per call (a slice per row reads a whole chunk per row: 1.1-6x slower here)
    span = np.arange(seq, dtype=np.int64)
    return [
        np.asarray(arr.oindex[(b.astype(np.int64)[:, None] * seq + span).ravel()]).reshape(
            len(b), seq
        )
        for b in batches
    ]


def sequential(arr, rows, block, seq):
    return [
        np.asarray(arr[a * seq : min(a + block, rows) * seq]).reshape(-1, seq)
        for a in range(0, rows, block)
    ]


def main() -> None:
    job = json.loads(sys.argv[1])
    seq = int(job["seq"])
    arr = zarr.open_group(job["store"], mode="r")["train"]["encoded_tokens"]
    batches = np.load(job["batches"])
    print(json.dumps({"ready": zarr.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        t = time.perf_counter()
        if req["op"] == "random":
            got = random_rows(arr, batches[: int(req["n"])], seq)
        else:
            got = sequential(arr, int(req["rows"]), int(req["block"]), seq)
        dt = time.perf_counter() - t
        h = hashlib.sha256(b"".join(g.tobytes() for g in got)).hexdigest()
        print(json.dumps({"seconds": dt, "digest": h}), flush=True)


if __name__ == "__main__":
    main()
