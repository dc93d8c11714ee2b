"""seqax's flat-tokens writing sequence on zarr-python 2 (run in .venv/extra-zarr2), written
from the behaviour recorded in ../shared/research/flat_tokens.md: open the root group with the
given mode, require the split group, ``max_token_id`` 0 unless present, reuse the split's arrays
or create them (Blosc lz4 level 5 bit-shuffle; a Delta i8 filter and one zero on
``seq_starts``), then per chunk raise ``max_token_id`` and append the shifted tokens (start bit
set) and the chunk's starts after the tokens already there.

Usage: python seqax_zarr2_helper.py '<json list of {path, split, mode, config, chunks}>'.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import zarr
from numcodecs import Blosc, Delta


def encode(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray, int]:
    lengths = [len(s) for s in sequences]
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
    ids = np.concatenate([np.asarray(s, np.uint32) for s in sequences])
    tokens = ids << np.uint32(1)
    for begin, n in zip(starts[:-1].tolist(), lengths, strict=True):
        if n:
            tokens[begin] |= np.uint32(1)
    return tokens, starts, ids.max()


def run(op: dict) -> None:
    root = zarr.open_group(op["path"], mode=op["mode"])
    group = root.require_group(op["split"])
    blosc = Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE)
    tokens_chunk, starts_chunk = op["config"]
    if "max_token_id" not in group.attrs:
        group.attrs["max_token_id"] = 0
    if "encoded_tokens" in group:
        tokens = group["encoded_tokens"]
    else:
        tokens = group.empty(
            "encoded_tokens", shape=(0,), chunks=(tokens_chunk,), dtype=np.uint32,
            compressor=blosc,
        )  # fmt: skip
    if "seq_starts" in group:
        starts = group["seq_starts"]
    else:
        starts = group.zeros(
            "seq_starts", shape=(1,), chunks=(starts_chunk,), dtype=np.uint64,
            compressor=blosc, filters=[Delta(dtype="i8")],
        )  # fmt: skip
    for sequences in op["chunks"]:
        encoded, seq_starts, max_id = encode(sequences)
        before = tokens.shape[0]
        if max_id > group.attrs["max_token_id"]:
            group.attrs["max_token_id"] = max_id
        tokens.append(encoded)
        starts.append(before + seq_starts[1:])


if __name__ == "__main__":
    for op in json.loads(sys.argv[1]):
        run(op)
