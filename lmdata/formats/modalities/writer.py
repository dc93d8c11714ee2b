"""Writing ``.pbin`` files byte-identical to modalities 0.5.0's ``pack_encoded_data``."""

from __future__ import annotations

import contextlib
import os
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from lmdata import _provenance
from lmdata._options import checked
from lmdata.errors import InvalidInputError
from lmdata.formats._span_index import dump_span_index
from lmdata.formats._spec import check_single_split
from lmdata.formats.modalities import sidecar
from lmdata.formats.modalities.layout import (
    DTYPES,
    HEADER_SIZE,
    TOKEN_WIDTHS,
    PbinHeader,
    width_for_max_id,
    width_for_vocab,
)
from lmdata.storage import AtomicWriter, manifest_output, resolve, shown

# What the tokenize pipeline needs to know: the end-of-document token goes after every
# document (the last one included) unless the tokenizer already ended the document with it,
# and an empty document is stored as the EOD token alone. Pass ``eod_id`` to the Writer.
EOD_POLICY = "append-unless-present"
eod_policy = EOD_POLICY

_SPOOL_WIDTH = 4  # tokens are spooled as uint32 when the width is decided at close
_COPY_TOKENS = 1 << 22


def as_token_array(tokens: Any) -> np.ndarray:
    """A 1-D integer array of ``tokens``, or InvalidInputError saying why not."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidInputError(
            f"a document must be a 1-D sequence of token ids, got shape {arr.shape}"
        )
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidInputError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr


class Writer(AtomicWriter):
    """Writes documents of token ids into a new ``.pbin`` file.

    The token width comes from ``vocab_size`` exactly as modalities computes it (note that for
    a Hugging Face tokenizer modalities uses ``tokenizer.vocab_size``, which excludes added
    tokens), or from ``token_width`` (1, 2 or 4); with neither, the smallest width holding the
    largest id written is chosen at close. ``eod_id`` is appended after each document unless
    ``append_eod`` is False or the document already ends with it; an empty document is stored
    as the EOD token alone. The file appears at ``path`` only when the writer closes cleanly.
    ``provenance`` (what made the tokens, see :mod:`lmdata._provenance`) goes into a sidecar
    ``<path>.lmdata.json``: the .pbin layout has no room for it. ``manifest`` (default True)
    writes ``<path>.lmdata-manifest`` beside it (the file's size, documents and hashes).
    """

    @checked("lmdata.formats.modalities.writer.Writer")
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        vocab_size: int | None = None,
        token_width: int | None = None,
        eod_id: int | None = None,
        append_eod: bool = True,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        provenance: dict[str, Any] | None = None,
        manifest: bool = True,
    ) -> None:
        width = self._pick_width(vocab_size, token_width)
        self._provenance = provenance
        self._overwrite = overwrite
        if eod_id is not None:
            if isinstance(eod_id, bool) or not isinstance(eod_id, (int, np.integer)) or eod_id < 0:
                raise InvalidInputError(f"eod_id must be a non-negative integer, got {eod_id!r}")
            eod_id = int(eod_id)
            if width is not None and eod_id >= 1 << (8 * width):
                raise InvalidInputError(
                    f"eod_id {eod_id} does not fit in {width}-byte tokens; check vocab_size"
                )
        self.token_width = width
        self.eod_id = eod_id
        self.append_eod = append_eod
        self._dtype = DTYPES[width or _SPOOL_WIDTH]
        self._limit = 1 << (8 * (width or _SPOOL_WIDTH))
        self._eod_bytes = (
            np.array([eod_id], dtype=self._dtype).tobytes() if eod_id is not None else b""
        )
        store, key = resolve(path, storage_options)
        # built in a local file (hashed as written; its header patched at close), renamed
        # into place at commit, or uploaded as one object
        self._out = manifest_output(
            store,
            key,
            directory=False,
            overwrite=overwrite,
            manifest=manifest,
            format="modalities",
            local=True,
        )
        assert self._out.tmp is not None
        self.path: Path | str = shown(store, self._out.dest)
        self._tmp = Path(self._out.tmp)
        self._f: Any = self._out.hashed("", open(self._tmp, "wb", buffering=1 << 20))
        self._f.write(bytes(HEADER_SIZE))  # patched at close, as the origin does
        self._lengths = array("q")  # document lengths in tokens
        self._max_id = -1
        self.documents = 0
        self.tokens = 0
        self.empty_documents = 0

    @staticmethod
    def _pick_width(vocab_size: int | None, token_width: int | None) -> int | None:
        from_vocab = width_for_vocab(vocab_size) if vocab_size is not None else None
        if token_width is None:
            return from_vocab
        if token_width not in TOKEN_WIDTHS:
            raise InvalidInputError(f"token_width must be 1, 2 or 4, got {token_width!r}")
        if from_vocab is not None and from_vocab != token_width:
            raise InvalidInputError(
                f"token_width {token_width} contradicts vocab_size {vocab_size}, which gives "
                f"{from_vocab}; pass only one of them"
            )
        return token_width

    def write(self, tokens: Any) -> None:
        """Append one document (a 1-D sequence of token ids)."""
        arr = as_token_array(tokens)
        n = arr.size
        if n:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self._limit:
                bad = lo if lo < 0 else hi
                raise InvalidInputError(
                    f"token id {bad} in document {self.documents} does not fit in "
                    f"{self.token_width or _SPOOL_WIDTH}-byte tokens "
                    f"(0..{self._limit - 1}); check vocab_size / token_width"
                )
            if hi > self._max_id:
                self._max_id = hi
            self._f.write(arr.astype(self._dtype, copy=False).tobytes())
        else:
            self.empty_documents += 1
        eod = self.eod_id
        if eod is not None and self.append_eod and (n == 0 or int(arr[-1]) != eod):
            self._f.write(self._eod_bytes)
            n += 1
            if eod > self._max_id:
                self._max_id = eod
        self._lengths.append(n)
        self.documents += 1
        self.tokens += n

    def write_many(self, flat: Any, lengths: Any, split: str = "train") -> None:
        """Append documents given as one flat array of token ids and their lengths (how
        tokenize and convert hand over tokens): the bytes and checks of :meth:`write` for each
        document, in a few passes over the whole array instead of a few calls per document.
        A token that does not fit is refused before any of these documents is written."""
        check_single_split(split, self)
        arr = as_token_array(flat)
        lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lens.size and (int(lens.min()) < 0 or int(lens.sum()) != arr.size):
            raise InvalidInputError(
                f"{lens.size} document lengths summing to {int(lens.sum())} do not split "
                f"{arr.size} tokens"
            )
        ends = np.cumsum(lens)
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self._limit:
                bad = lo if lo < 0 else hi
                doc = int(np.searchsorted(ends, int(np.flatnonzero(arr == bad)[0]), "right"))
                raise InvalidInputError(
                    f"token id {bad} in document {self.documents + doc} does not fit in "
                    f"{self.token_width or _SPOOL_WIDTH}-byte tokens "
                    f"(0..{self._limit - 1}); check vocab_size / token_width"
                )
            self._max_id = max(self._max_id, hi)
        out = arr.astype(self._dtype, copy=False)
        eod = self.eod_id
        if eod is not None and self.append_eod and lens.size:
            # an EOD after every document that does not end with it (an empty one included)
            last = out[np.maximum(ends - 1, 0)] if out.size else np.zeros(lens.size, self._dtype)
            need = (lens == 0) | (last != eod)
            if need.any():
                out = np.insert(out, ends[need], np.asarray(eod, dtype=self._dtype))
                lens = lens + need
                self._max_id = max(self._max_id, eod)
        self._f.write(out.tobytes())
        self.empty_documents += int(np.count_nonzero(np.asarray(lengths).reshape(-1) == 0))
        self._lengths.extend(lens.tolist())
        self.documents += int(lens.size)
        self.tokens += int(out.size)

    def write_batch(self, documents: Any) -> None:
        """Append several documents, in order."""
        for d in documents:
            self.write(d)

    def close(self) -> None:
        """Write the index, patch the header and move the file into place."""
        if self._out.done:
            return
        try:
            self._finish()
        except BaseException:
            self.abort()
            raise
        self._out.count(self.documents, "")
        store, key = self._out.store, self._out.dest
        if self._overwrite or not store.exists(key):
            # a kill after the commit leaves no sidecar rather than one describing the old file
            _provenance.remove_sidecar(store, key)
            sidecar.remove(store, key)  # the old file's index copy
        self._out.commit()
        if self._provenance is not None:
            _provenance.write_sidecar(store, key, self._provenance)

    def _finish(self) -> None:
        self._f.flush()
        width = self.token_width
        if width is None:
            width = width_for_max_id(max(self._max_id, 0))
            if width != _SPOOL_WIDTH:
                self._f.close()
                self._narrow(width)
        lengths = np.frombuffer(self._lengths, dtype=np.int64) * width
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        data_len = int(lengths.sum())
        self._f.write(dump_span_index(offsets, lengths))
        self._f.seek(0)
        self._f.write(PbinHeader(data_len, width, 0).pack())
        self._f.close()
        self.token_width = width

    def _narrow(self, width: int) -> None:
        """Rewrite the uint32 spool with ``width``-byte tokens (all ids are known to fit) into
        a new file, left open as ``self._f`` for the index and the header."""
        src = self._tmp.with_name(self._tmp.name + ".wide")
        os.replace(self._tmp, src)
        try:
            fo = open(self._tmp, "wb", buffering=1 << 20)
            self._f = self._out.hashed("", fo)
            with open(src, "rb") as fi:
                self._f.write(fi.read(HEADER_SIZE))
                while True:
                    chunk = fi.read(_COPY_TOKENS * _SPOOL_WIDTH)
                    if not chunk:
                        break
                    self._f.write(
                        np.frombuffer(chunk, dtype=DTYPES[_SPOOL_WIDTH])
                        .astype(DTYPES[width])
                        .tobytes()
                    )
        finally:
            with contextlib.suppress(FileNotFoundError):
                src.unlink()

    def abort(self) -> None:
        """Discard everything written; nothing appears at ``path``."""
        with contextlib.suppress(Exception):
            self._f.close()
        self._out.abort()
