"""Token writers per target format, behind one small interface, with each format's EOD policy.

flat-tokens marks starts with its start bit and adds no EOD; Modalities appends the EOD token
after each document (unless the document already ends with it, as the origin does); MDS and
Atlas store the tokens as they are. ``append_eod`` / ``eod`` override the default.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.tokenize.tokenizers import Tokenizer

if TYPE_CHECKING:
    from lmdata.tokenize.pipeline import TokenizeJob

TOKEN_FORMATS = ("flat-tokens", "modalities", "mds", "atlas")
DEFAULT_APPEND_EOD = {"flat-tokens": False, "modalities": True, "mds": False, "atlas": False}
SPLIT_FORMATS = ("flat-tokens",)


class _Sink:
    """Adapts a format writer to ``write_many(flat_tokens, lengths, validation_flags)``."""

    def __init__(
        self,
        writer: Any,
        write_doc: Callable[[np.ndarray, bool], None],
        eod_id: int | None,
        fast: Callable[..., None] | None = None,
    ) -> None:
        self.writer = writer
        self._write_doc = write_doc
        self._eod = eod_id
        self._fast = fast  # write_many(flat, lengths, split=...) where the writer has one

    def write_many(self, flat: np.ndarray, lengths: np.ndarray, validation: np.ndarray) -> int:
        """Write the documents; return the number of tokens written (EOD tokens included)."""
        if self._fast is not None and self._eod is None:
            _write_runs(self._fast, flat, lengths, validation)
            return len(flat)
        pos = written = 0
        for n, v in zip(lengths.tolist(), validation.tolist(), strict=True):
            doc = flat[pos : pos + n]
            pos += n
            if self._eod is not None and (n == 0 or doc[-1] != self._eod):
                doc = np.append(doc, np.uint32(self._eod))
            self._write_doc(doc, v)
            written += len(doc)
        return written

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


def _write_runs(
    fast: Callable[..., None], flat: np.ndarray, lengths: np.ndarray, validation: np.ndarray
) -> None:
    """Call ``fast(flat, lengths, split=...)`` once per run of documents of one split."""
    if len(lengths) == 0:
        return
    change = np.nonzero(validation[1:] != validation[:-1])[0] + 1
    edges = np.concatenate([[0], change, [len(lengths)]])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        split = "validation" if validation[a] else "train"
        fast(flat[offsets[a] : offsets[b]], lengths[a:b], split=split)


def resolve_eod(job: TokenizeJob, tok: Tokenizer) -> int | None:
    """The EOD id to append after each document, or None."""
    if job.eod is not None and job.eod_id is not None:
        raise InvalidInputError("give the end-of-document token once: --eod TOKEN or --eod-id N")
    append = job.append_eod
    if append is None:  # naming an EOD token means "append it"; else the format's convention
        append = (
            job.eod is not None or job.eod_id is not None or DEFAULT_APPEND_EOD.get(job.to, False)
        )
    if not append:
        return None
    if job.eod_id is not None:
        return job.eod_id
    if job.eod is None:
        raise InvalidInputError(
            f"{job.to} ends every document with an end-of-document token: pass --eod TOKEN "
            "(for example '<|endoftext|>'), --eod-id N, or --no-eod"
        )
    eod = tok.token_id(job.eod)
    if eod is None:
        raise InvalidInputError(f"the tokenizer has no token {job.eod!r}; pass --eod-id N")
    return eod


def make_sink(job: TokenizeJob, tok: Tokenizer) -> Callable[..., _Sink]:
    """A factory ``(dst, overwrite) -> sink`` for ``job.to``, after checking the options."""
    if job.to not in TOKEN_FORMATS:
        raise InvalidInputError(
            f"cannot tokenize into {job.to!r}; token formats: {', '.join(TOKEN_FORMATS)}"
        )
    if job.to not in SPLIT_FORMATS and job.validation_fraction > 0:
        raise InvalidInputError(
            f"{job.to} has no validation split; tokenize the validation documents into a "
            "separate output instead of --validation-fraction"
        )
    eod = resolve_eod(job, tok)
    opts = dict(job.writer_options)

    def factory(dst: Path, overwrite: bool = False) -> _Sink:
        from lmdata._api import writer

        if job.to == "flat-tokens":
            w = writer(dst, "flat-tokens", overwrite=overwrite, **opts)
            return _Sink(
                w,
                lambda d, v: w.write(d, split="validation" if v else "train"),
                eod,
                fast=w.write_many,
            )
        if job.to == "modalities":
            w = writer(
                dst,
                "modalities",
                overwrite=overwrite,
                vocab_size=tok.vocab_size,
                eod_id=eod,
                append_eod=False,
                **opts,
            )
            return _Sink(w, lambda d, v: w.write(d), eod)
        dtype = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
        if job.to == "mds":
            w = writer(
                dst, "mds", overwrite=overwrite, columns={"tokens": f"ndarray:{dtype}"}, **opts
            )
            return _Sink(w, lambda d, v: w.write({"tokens": d.astype(dtype)}), eod)
        w = writer(dst, "atlas", overwrite=overwrite, **opts)
        return _Sink(w, lambda d, v: w.write({"tokens": d.astype(dtype)}), eod)

    return factory
