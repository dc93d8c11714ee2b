"""Where tokenized documents go: the target format's token sink, with its EOD convention.

Each format's spec says how token sequences are written into it
(:class:`lmdata.formats.TokenTarget`): whether the format ends every document with an
end-of-document token (Modalities does; flat-tokens marks starts with its start bit instead)
and how to open its writer. ``append_eod`` / ``eod`` / ``eod_id`` override the convention; the
EOD is appended here, vectorised, so every format receives finished documents.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from lmdata import _provenance
from lmdata.errors import InvalidInputError
from lmdata.formats import TokenSink
from lmdata.tokenize.job import TokenizeJob
from lmdata.tokenize.tokenizers import Tokenizer


def append_eod(flat: np.ndarray, lengths: np.ndarray, eod: int) -> tuple[np.ndarray, np.ndarray]:
    """Append ``eod`` to every document that does not already end with it (empty ones too)."""
    if len(lengths) == 0:
        return flat, lengths
    ends = np.cumsum(lengths)
    need = lengths == 0
    nonempty = ~need
    need[nonempty] = flat[ends[nonempty] - 1] != eod
    if not need.any():
        return flat, lengths
    if eod > np.iinfo(flat.dtype).max:  # staged as uint16, an EOD id beyond
        flat = flat.astype(np.uint32)
    out = np.insert(flat, ends[need], np.asarray(eod, dtype=flat.dtype))
    return out, lengths + need


class EodSink:
    """Wraps a format's sink: appends the EOD token, counts what was written."""

    def __init__(self, sink: TokenSink, eod_id: int | None) -> None:
        self.sink = sink
        self._eod = eod_id

    def write_many(self, flat: np.ndarray, lengths: np.ndarray, validation: np.ndarray) -> int:
        """Write the documents; return the number of tokens written (EOD tokens included)."""
        if self._eod is not None:
            flat, lengths = append_eod(flat, lengths, self._eod)
        _write_runs(self.sink, flat, lengths, validation)
        return len(flat)

    def close(self) -> None:
        self.sink.close()

    def abort(self) -> None:
        self.sink.abort()


def _write_runs(
    sink: TokenSink, flat: np.ndarray, lengths: np.ndarray, validation: np.ndarray
) -> None:
    """Call ``sink.write_many`` once per run of documents of one split."""
    if len(lengths) == 0:
        return
    change = np.nonzero(validation[1:] != validation[:-1])[0] + 1
    edges = np.concatenate([[0], change, [len(lengths)]])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        split = "validation" if validation[a] else "train"
        sink.write_many(flat[offsets[a] : offsets[b]], lengths[a:b], split)


def resolve_eod(job: TokenizeJob, tok: Tokenizer) -> int | None:
    """The EOD id to append after each document, or None."""
    if job.eod is not None and job.eod_id is not None:
        raise InvalidInputError("give the end-of-document token once: --eod TOKEN or --eod-id N")
    append = job.append_eod
    if append is None:  # naming an EOD token means "append it"; else the format's convention
        append = job.eod is not None or job.eod_id is not None or job.target.append_eod
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


def make_sink(
    job: TokenizeJob, tok: Tokenizer, encoder: str | None = None
) -> Callable[..., EodSink]:
    """A factory ``(dst, overwrite) -> sink`` for ``job.to``, after checking the options; the
    sink records what made the tokens (:mod:`lmdata._provenance`: the tokenizer, and the
    ``encoder`` that encoded with it) in the dataset."""
    if job.validation_fraction > 0 and "validation" not in job.spec.splits:
        raise InvalidInputError(
            f"{job.to} has no validation split; tokenize the validation documents into a "
            "separate output instead of --validation-fraction"
        )
    eod = resolve_eod(job, tok)

    def factory(dst: Path, overwrite: bool = False) -> EodSink:
        # the record hashes and reads the tokenizer file: made when a sink opens, not to check
        opts = dict(job.writer_options)
        opts.setdefault("provenance", _provenance.record(tok, eod, job.special_tokens, encoder))
        sink = job.target.open(
            dst, overwrite=overwrite, vocab_size=tok.vocab_size, eod_id=eod, options=opts
        )
        return EodSink(sink, eod)

    return factory
