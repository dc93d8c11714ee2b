"""``lmdata merge`` for ``.pbin`` files: concatenation with a correct index.

modalities' ``merge_packed_data`` shifts each later file's offsets by 12 bytes too few; here
every offset is shifted by the exact data length before it. Inputs of different token widths
are widened to the largest (modalities refuses them).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.formats._span_index import dump_span_index
from lmdata.formats.modalities.layout import DTYPES, PbinHeader
from lmdata.formats.modalities.reader import PackedTokens
from lmdata.storage import AtomicOutput, require_exists

_COPY_TOKENS = 1 << 22


def expand_inputs(inputs: list[str | os.PathLike[str]]) -> list[Path]:
    """Files as given; directories contribute their ``**/*.pbin`` in sorted order."""
    out: list[Path] = []
    for item in inputs:
        p = require_exists(item)
        if p.is_dir():
            found = sorted(p.glob("**/*.pbin"))
            if not found:
                raise InvalidInputError("directory holds no .pbin files", path=p)
            out.extend(found)
        else:
            out.append(p)
    return out


def merge(
    inputs: list[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    overwrite: bool = False,
) -> str:
    """Concatenate the ``.pbin`` files ``inputs`` (in order) into ``output``."""
    paths = expand_inputs(inputs)
    dest = Path(output)
    if any(p.resolve() == dest.resolve() for p in paths if dest.exists()):
        raise InvalidInputError("the output is also an input; write to a new path", path=dest)
    readers = [PackedTokens(p) for p in paths]
    width = max(r.token_width for r in readers)
    dtype = DTYPES[width]
    offsets, lengths = [], []
    base = 0  # tokens written so far
    out = AtomicOutput(dest, directory=False, overwrite=overwrite)
    try:
        with open(out.tmp, "wb") as f:
            f.write(bytes(12))
            for r in readers:
                offsets.append((r.doc_starts + base) * width)
                lengths.append(r.doc_lengths * width)
                t = r.tokens
                for lo in range(0, len(t), _COPY_TOKENS):
                    f.write(np.ascontiguousarray(t[lo : lo + _COPY_TOKENS], dtype=dtype).data)
                base += len(t)
                r.close()
            f.write(dump_span_index(np.concatenate(offsets), np.concatenate(lengths)))
            f.seek(0)
            f.write(PbinHeader(base * width, width, 0).pack())
    except BaseException:
        out.abort()
        raise
    out.finish()
    docs = sum(len(x) for x in lengths)
    return (
        f"merged {len(paths)} files: {docs:,} documents, {base:,} tokens ({width}-byte) -> {dest}"
    )
