"""A source is picked by what its reader offers, stated as protocols: the Loader's fast path
(``EncodedTokens``), an index read in parts (``SequenceIndex``), document ids
(``DocumentIds``); never by probing method names. Both kinds of source read the same rows."""

from __future__ import annotations

import inspect
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.formats._token_view import TokenColumn
from lmdata.loader import Loader
from lmdata.loader.sources import EncodedSource, Source, make_source
from lmdata.protocols import (
    DocumentIds,
    EncodedTokens,
    SequenceIndex,
    TokenSequences,
    TokenSpans,
    members,
    missing,
    satisfies,
)
from tests.loader.conftest import Plain, random_seqs, write_flat

OPTIONS = dict(finite=False, long_docs="truncate", dtype=np.dtype(np.int64), bos=0, pad_id=0)


def test_flat_tokens_offers_every_capability_and_a_plain_reader_none(tmp_path: Path) -> None:
    flat = write_flat(tmp_path / "d.zarr", random_seqs(0, 20))
    for proto in (TokenSequences, EncodedTokens, SequenceIndex):
        assert satisfies(flat, proto), missing(flat, proto)
    plain = Plain(random_seqs(0, 20))
    assert satisfies(plain, TokenSpans)
    assert not satisfies(plain, EncodedTokens) and not satisfies(plain, SequenceIndex)
    view = TokenColumn(_Records([{"id": "a", "tokens": np.arange(3)}]), "tokens")
    assert satisfies(view, DocumentIds) and view.document_ids(np.array([0])) == ["a"]


@pytest.mark.parametrize("proto", [EncodedTokens, SequenceIndex])
def test_flat_tokens_methods_have_the_protocols_signatures(tmp_path: Path, proto) -> None:
    """The names, kinds and defaults of every parameter (what a caller relies on)."""
    from lmdata.formats.flat_tokens.reader import FlatTokens

    for name in sorted(members(proto) - members(TokenSequences)):
        want = getattr(proto, name)
        if isinstance(want, property):
            assert isinstance(getattr(FlatTokens, name), property), name
            continue
        got = inspect.signature(getattr(FlatTokens, name)).parameters
        params = inspect.signature(want).parameters
        assert [(p.name, p.kind, p.default) for p in got.values()] == [
            (p.name, p.kind, p.default) for p in params.values()
        ], name


def test_make_source_picks_by_capability(tmp_path: Path) -> None:
    seqs = random_seqs(1, 30)
    flat = write_flat(tmp_path / "d.zarr", seqs)
    assert type(make_source(flat, "packed", 8, **OPTIONS)) is EncodedSource
    assert type(make_source(Plain(seqs), "packed", 8, **OPTIONS)) is Source

    class Partial(Plain):  # some of the names, not the protocol: read the generic way
        def span_encoded(self, a: int, b: int) -> np.ndarray:
            raise AssertionError("not the fast path")

        def encoded_windows(self, *a, **k) -> np.ndarray:
            raise AssertionError("not the fast path")

    src = make_source(Partial(seqs), "packed", 8, **OPTIONS)
    assert type(src) is Source
    assert src.read(np.arange(src.num_rows))["inputs"].shape == (src.num_rows, 8)


def test_the_capability_check_evaluates_no_property() -> None:
    class Costly(Plain):
        @property
        def boundaries(self) -> np.ndarray:  # may read a whole index: never read to check
            raise AssertionError("evaluated")

        @boundaries.setter
        def boundaries(self, value: np.ndarray) -> None:
            pass

    r = Costly(random_seqs(2, 5))
    assert satisfies(r, TokenSpans) and not satisfies(r, EncodedTokens)
    assert missing(r, EncodedTokens)[:2] == ["__iter__", "close"]


def test_scaled_windows_are_packed_rows(tmp_path: Path) -> None:
    flat = write_flat(tmp_path / "d.zarr", random_seqs(3, 200, 80), chunk_tokens=64)
    L = 16
    rows = np.array([0, 5, 3, flat.num_tokens // L - 1], dtype=np.int64)
    want = flat.packed_rows(rows, L)
    assert np.array_equal(flat.encoded_windows(rows, L, scale=L), want)
    assert np.array_equal(flat.encoded_windows(rows * 2, L, scale=L // 2), want)
    out = np.zeros((len(rows), L), np.uint32)
    flat.encoded_windows(rows, L, scale=L, out=out)
    assert np.array_equal(out, want)
    parts = flat.encoded_window_parts(rows, L, scale=L)
    if parts is not None:  # (C built: the windows where they lie)
        got = [np.frombuffer(b, np.uint32, L, o) for b, o in zip(parts[0], parts[1], strict=True)]
        assert np.array_equal(np.stack(got), want)
    with pytest.raises(IndexError):
        flat.encoded_windows(np.array([flat.num_tokens // L]), L, scale=L)


class _Records:
    format = "records"

    def __init__(self, recs: list) -> None:
        self.recs = recs

    def __len__(self) -> int:
        return len(self.recs)

    def __getitem__(self, i: int) -> dict:
        return self.recs[i]

    def take(self, idx) -> list:
        return [self.recs[int(i)] for i in idx]


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(["packed", "eos", "unpacked", "bestfit"]),
    finite=st.booleans(),
    L=st.integers(3, 40),
    chunk=st.sampled_from([32, 64, 1024]),
)
def test_both_sources_read_the_same_rows(seed, mode, finite, L, chunk) -> None:
    seqs = random_seqs(seed, 40, 70)
    with tempfile.TemporaryDirectory() as tmp:
        flat = write_flat(Path(tmp) / "d.zarr", seqs, chunk_tokens=chunk)
        kw = dict(
            seq_len=L, global_batch_size=2, mode=mode, seed=seed, epochs=1 if finite else None
        )
        try:
            fast, plain = Loader(flat, **kw), Loader(Plain(seqs), **kw)
        except Exception as e:  # too few tokens for one row: both refuse alike
            with pytest.raises(type(e)):
                Loader(Plain(seqs), **kw)
            return
        assert type(fast.sources[0]) is EncodedSource and type(plain.sources[0]) is Source
        assert fast.steps_per_epoch == plain.steps_per_epoch
        for step in range(min(fast.steps_per_epoch or 3, 3)):
            a, b = fast.batch(step), plain.batch(step)
            assert a.keys() == b.keys()
            for k in a:
                assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), (k, step)
