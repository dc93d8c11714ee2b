"""``lmdata merge`` for ``.pbin`` files: concatenation with a correct index.

modalities' ``merge_packed_data`` shifts each later file's offsets by 12 bytes too few; here
every offset is shifted by the exact data length before it. Inputs of different token widths
are widened to the largest (modalities refuses them). Inputs and output may be local paths or
URLs: tokens are read in blocks (ranged reads on object stores, never a whole file in memory)
and the output, built locally first, appears whole at the end (a rename on local disk, one
object behind a claim on an object store), with the same bytes wherever it is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lmdata import _provenance
from lmdata._progress import OnProgress, Ticker
from lmdata.errors import InvalidInputError
from lmdata.formats._span_index import dump_span_index
from lmdata.formats._spec import MergeSummary
from lmdata.formats.modalities import sidecar
from lmdata.formats.modalities.layout import DTYPES, HEADER_SIZE, PbinHeader
from lmdata.formats.modalities.reader import PackedTokens
from lmdata.storage import (
    Store,
    is_url,
    join,
    manifest_output,
    require_exists,
    resolve,
)

_COPY_TOKENS = 1 << 22


def _find_pbin(store: Store, key: str) -> Iterator[str]:
    """Keys of the ``.pbin`` objects below directory ``key``, at any depth."""
    objects = store.sizes(key)
    for name in store.list(key):
        if name not in objects:
            yield from _find_pbin(store, join(key, name))
        elif name.endswith(".pbin"):
            yield join(key, name)


def expand_inputs(inputs: list[str | os.PathLike[str]]) -> list[str]:
    """Files as given; directories contribute their ``**/*.pbin`` in sorted order (by path
    components, as local paths sort)."""
    out: list[str] = []
    for item in inputs:
        require_exists(item)
        store, key = resolve(item)
        if not store.is_dir(key):
            out.append(os.fspath(item))
            continue
        if is_url(item):
            found = [store.url(k) for k in sorted(_find_pbin(store, key), key=_parts)]
        else:
            found = [str(p) for p in sorted(Path(key).glob("**/*.pbin"))]
        if not found:
            raise InvalidInputError("directory holds no .pbin files", path=os.fspath(item))
        out.extend(found)
    return out


def _parts(key: str) -> list[str]:
    return key.split("/")


def _same(a: str, b: str) -> bool:
    """Whether two inputs name the same file or object."""
    (sa, ka), (sb, kb) = resolve(a), resolve(b)
    if sa.id != sb.id:
        return False
    if sa.can_mmap:  # local paths: through links and relative forms
        return Path(ka).resolve() == Path(kb).resolve()
    return sa.url(ka) == sb.url(kb)


def merge(
    inputs: list[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    overwrite: bool = False,
    progress: OnProgress | None = None,
) -> MergeSummary:
    """Concatenate the ``.pbin`` files ``inputs`` (in order) into ``output``; ``progress``
    counts the inputs' token bytes copied."""
    paths = expand_inputs(inputs)
    dest = os.fspath(output)
    store, key = resolve(dest)
    if store.exists(key) and any(_same(p, dest) for p in paths):
        raise InvalidInputError("the output is also an input; write to a new path", path=dest)
    readers = [PackedTokens(p) for p in paths]
    # the inputs' one tokenizer (refused if they differ), read before anything is written
    try:
        kept = _provenance.joined(
            [_provenance.read_sidecar(r.data.store, r.data.key) for r in readers],
            [str(p) for p in paths],
        )
    except BaseException:
        for r in readers:
            r.close()
        raise
    out = manifest_output(
        store, key, directory=False, overwrite=overwrite, format="modalities", local=True
    )
    try:
        assert out.tmp is not None  # a seekable local file: uploaded at commit on a store
        with out.hashed("", open(out.tmp, "wb", buffering=1 << 20)) as f:
            tick = Ticker(progress, sum(r.header.data_len for r in readers), "merge")
            docs, tokens, _width = _write(readers, f, tick)
        out.count(docs, "")
    except BaseException:
        out.abort()
        raise
    finally:
        for r in readers:
            r.close()
    if overwrite or not store.exists(key):
        # as the writer: a kill after the commit leaves no sidecar describing the old file
        _provenance.remove_sidecar(store, key)
        sidecar.remove(store, key)  # the old file's index copy
    out.commit()
    if kept is not None:
        _provenance.write_sidecar(store, key, kept)
    return MergeSummary("modalities", len(paths), store.url(key), docs, tokens=tokens)


def _write(readers: list[PackedTokens], f: BinaryIO, tick: Ticker) -> tuple[int, int, int]:
    """The merged file into ``f``: (documents, tokens, token width)."""
    width = max(r.token_width for r in readers)
    dtype = DTYPES[width]
    offsets, lengths = [], []
    base = 0  # tokens written so far
    f.write(bytes(HEADER_SIZE))
    for r in readers:
        offsets.append((r.doc_starts + base) * width)
        lengths.append(r.doc_lengths * width)
        n = r.header.num_tokens
        for lo in range(0, n, _COPY_TOKENS):
            hi = min(n, lo + _COPY_TOKENS)
            block = r.tokens[lo:hi] if r.data.mapped else r.data.read_tokens([(lo, hi)])[0]
            f.write(np.ascontiguousarray(block, dtype=dtype).data)
            tick.add((hi - lo) * r.token_width)
        base += n
    f.write(dump_span_index(np.concatenate(offsets), np.concatenate(lengths)))
    f.seek(0)
    f.write(PbinHeader(base * width, width, 0).pack())
    return sum(len(x) for x in lengths), base, width
