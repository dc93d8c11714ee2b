"""The Loader: row layouts, stateless shuffle, ranks, evaluation passes, options, errors."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.loader import Loader, Permutation
from tests.loader.conftest import Plain, random_seqs, write_flat

seq_lists = st.lists(st.lists(st.integers(1, 2000), max_size=12), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**63 - 1))
def test_permutation_is_a_bijection(n, seed):
    out = Permutation(n, seed)(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))


def test_permutation_is_pinned_and_seeded():
    # golden values: a change here changes every user's data order
    assert Permutation(10, 42)(np.arange(10)).tolist() == [4, 1, 0, 8, 2, 9, 7, 5, 3, 6]
    assert (
        Permutation(1000, 1)(np.arange(5)).tolist() != Permutation(1000, 2)(np.arange(5)).tolist()
    )
    x = Permutation(10**12, 7)(np.array([0, 1, 10**12 - 1]))
    assert ((0 <= x) & (x < 10**12)).all() and len(set(x.tolist())) == 3


def test_spec_example_exactly(tmp_path):
    r = write_flat(tmp_path / "s.zarr", [[1, 2], [3, 4, 5], [6, 7, 8]], chunk_tokens=4)
    b = Loader(r, seq_len=8, global_batch_size=1, shuffle=False).batch(0)
    assert b["inputs"].tolist() == [[0, 1, 0, 3, 4, 0, 6, 7]]
    assert b["targets"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert b["segment_ids"].tolist() == [[1, 1, 2, 2, 2, 3, 3, 3]]
    assert b["positions"].tolist() == [[0, 1, 0, 1, 2, 0, 1, 2]]
    assert set(b) == {"inputs", "targets", "segment_ids", "positions"}
    assert b["inputs"].dtype == np.int32 and b["segment_ids"].dtype == np.int32


def _expected_packed(flat, starts, row_start, L):
    """segment ids / positions / inputs of one packed row, written out the slow way."""
    seg, pos, inp = [], [], []
    s, p = 0, 0
    for j in range(L):
        t = row_start + j
        if j == 0 or t in starts:
            s, p = s + 1, 0
        seg.append(s)
        pos.append(p)
        inp.append(0 if (j == 0 or t in starts) else int(flat[t - 1]))
        p += 1
    return seg, pos, inp


@pytest.mark.native
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqs=seq_lists, L=st.integers(1, 9), fast=st.booleans())
def test_segment_ids_and_positions_restart_at_every_document(seqs, L, fast):
    flat = np.array([t for s in seqs for t in s], dtype=np.int64)
    if len(flat) < L:
        return
    with tempfile.TemporaryDirectory() as d:
        r = write_flat(Path(d) / "x.zarr", seqs, chunk_tokens=8) if fast else Plain(seqs)
        loader = Loader(r, seq_len=L, global_batch_size=1, shuffle=False)
        starts = set(np.cumsum([0] + [len(s) for s in seqs])[:-1][[len(s) > 0 for s in seqs]])
        for row in range(len(flat) // L):
            b = loader.batch(row)
            seg, pos, inp = _expected_packed(flat, starts, row * L, L)
            assert b["targets"][0].tolist() == flat[row * L : (row + 1) * L].tolist()
            assert b["segment_ids"][0].tolist() == seg
            assert b["positions"][0].tolist() == pos
            assert b["inputs"][0].tolist() == inp


@settings(max_examples=60, deadline=None)
@given(data=st.data(), rows=st.integers(1, 6), length=st.integers(1, 40), bos=st.integers(0, 9))
def test_packed_expansion_equals_the_definition(data, rows, length, bos):
    from lmdata.loader.packing import packed_from_encoded, packed_from_starts, starts_in_rows

    n = rows * length
    ids = np.array(data.draw(st.lists(st.integers(0, 2**30), min_size=n, max_size=n)))
    bits = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    enc = (ids.astype(np.uint32) << 1 | bits).reshape(rows, length)
    got = packed_from_encoded(enc, np.dtype(np.int32), bos)
    seg, pos, inp = [], [], []
    for r in range(rows):  # the definition, one token at a time
        s = p = 0
        for j in range(length):
            t = r * length + j
            start = j == 0 or bits[t]
            s, p = (s + 1, 0) if start else (s, p + 1)
            seg.append(s)
            pos.append(p)
            inp.append(bos if start else int(ids[t - 1]))
    assert got["targets"].ravel().tolist() == ids.tolist()
    assert got["inputs"].ravel().tolist() == inp
    assert got["segment_ids"].ravel().tolist() == seg
    assert got["positions"].ravel().tolist() == pos
    # the generic path (sequence starts from boundaries) gives the same arrays
    flat_starts = starts_in_rows(np.flatnonzero(bits), np.arange(rows) * length, length)
    again = packed_from_starts(ids.reshape(rows, length), flat_starts, np.dtype(np.int32), bos)
    assert all(np.array_equal(again[k], got[k]) for k in got)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqs=seq_lists, L=st.integers(1, 7), G=st.integers(1, 5), fast=st.booleans())
def test_eos_every_token_after_the_first_is_a_target_exactly_once(seqs, L, G, fast):
    flat = [t for s in seqs for t in s]
    if len(flat) < 2:
        return
    with tempfile.TemporaryDirectory() as d:
        r = write_flat(Path(d) / "x.zarr", seqs, chunk_tokens=8) if fast else Plain(seqs)
        loader = Loader(r, seq_len=L, global_batch_size=G, mode="eos", epochs=1, seed=3)
        got = []
        for b in loader:
            m = b["loss_mask"]
            got += b["targets"][m].tolist()
            # inputs are the targets' predecessors
            assert (b["inputs"][:, 1:][m[:, 1:]] == b["targets"][:, :-1][m[:, 1:]]).all()
        assert sorted(got) == sorted(flat[1:])


@settings(max_examples=40, deadline=None)
@given(
    n_tokens=st.integers(8, 400),
    L=st.integers(1, 8),
    G=st.integers(1, 7),
    seed=st.integers(0, 2**40),
)
def test_each_epoch_is_a_permutation_of_the_rows(n_tokens, L, G, seed):
    r = Plain([np.arange(1, n_tokens + 1)])
    loader = Loader(r, seq_len=L, global_batch_size=G, seed=seed)
    n = loader.num_rows
    steps = -(-3 * n // G)
    stream = np.concatenate([loader.indices(s)[1] for s in range(steps)])[: 3 * n]
    epochs = [stream[i * n : (i + 1) * n] for i in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(n))
    if n > 4:
        assert not (np.array_equal(epochs[0], epochs[1]) and np.array_equal(epochs[1], epochs[2]))


def test_generic_reader_equals_the_flat_tokens_fast_path(dataset):
    r, seqs = dataset
    for mode in ("packed", "eos", "unpacked"):
        for epochs in (None, 1):
            a = Loader(r, seq_len=24, global_batch_size=5, seed=9, mode=mode, epochs=epochs)
            b = Loader(
                Plain(seqs), seq_len=24, global_batch_size=5, seed=9, mode=mode, epochs=epochs
            )
            last = len(a) - 1 if epochs else 40
            for step in (0, 1, 17, last):
                x, y = a.batch(step), b.batch(step)
                assert x.keys() == y.keys()
                for k in x:
                    assert np.array_equal(x[k], y[k]), (mode, epochs, k)


def test_ranks_slice_the_global_batch(dataset):
    r, _ = dataset
    whole = Loader(r, seq_len=8, global_batch_size=12, seed=5, rank=0, world_size=1)
    for ws in (2, 3, 4):
        parts = [
            Loader(r, seq_len=8, global_batch_size=12, seed=5, rank=k, world_size=ws)
            for k in range(ws)
        ]
        for step in (0, 3, 50):
            got = np.concatenate([p.batch(step)["targets"] for p in parts])
            assert np.array_equal(got, whole.batch(step)["targets"])
    with pytest.raises(InvalidInputError, match="divisible"):
        Loader(r, seq_len=8, global_batch_size=12, rank=0, world_size=5)
    with pytest.raises(InvalidInputError, match="rank"):
        Loader(r, seq_len=8, global_batch_size=12, rank=2, world_size=2)


def test_topology_from_the_environment(dataset, monkeypatch):
    r, _ = dataset
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    a = Loader(r, seq_len=8, global_batch_size=4, seed=1)
    assert (a.rank, a.world_size, a.local_batch_size) == (1, 2, 2)
    whole = Loader(r, seq_len=8, global_batch_size=4, seed=1, rank=0, world_size=1)
    assert np.array_equal(a.batch(3)["targets"], whole.batch(3)["targets"][2:])


def test_evaluation_pass_covers_every_token_once_and_stops(dataset):
    r, seqs = dataset
    flat = np.concatenate(seqs)
    loader = Loader(r, seq_len=16, global_batch_size=7, shuffle=False, epochs=1)
    n = len(loader)
    rows = -(-len(flat) // 16)
    assert n == -(-rows // 7)
    batches = list(loader)
    assert len(batches) == n and loader.step == n
    got = np.concatenate([b["targets"][b["loss_mask"]] for b in batches])
    assert np.array_equal(got, flat)  # in order, every token once, the tail padded not dropped
    assert not batches[-1]["loss_mask"][-1].any()  # the last batch is padded
    assert (batches[-1]["targets"][~batches[-1]["loss_mask"]] == 0).all()
    again = list(loader)  # a pass is over: iterating again is a new, whole pass
    assert len(again) == n and all(
        np.array_equal(a["targets"], b["targets"]) for a, b in zip(again, batches, strict=True)
    )
    with pytest.raises(InvalidInputError, match="past the end"):
        loader.batch(n)
    with pytest.raises(TypeError, match="endless"):
        len(Loader(r, seq_len=16, global_batch_size=7))


def test_unpacked_documents_split_truncate_and_error(dataset):
    r, seqs = dataset
    split = Loader(r, seq_len=7, global_batch_size=8, mode="unpacked", long_docs="split", epochs=1)
    got = [b["targets"][b["loss_mask"]] for b in split]
    assert sorted(np.concatenate(got).tolist()) == sorted(np.concatenate(seqs).tolist())
    trunc = Loader(r, seq_len=20, global_batch_size=6, mode="unpacked", shuffle=False)
    b = trunc.batch(0)
    for i in range(6):
        s = seqs[i][:20]
        assert b["targets"][i, : len(s)].tolist() == s.tolist()
        assert b["loss_mask"][i].sum() == len(s) and (b["targets"][i, len(s) :] == 0).all()
        assert b["positions"][i, : len(s)].tolist() == list(range(len(s)))
        if len(s):
            assert b["inputs"][i, 0] == 0 and b["inputs"][i, 1 : len(s)].tolist() == s[:-1].tolist()
    strict = Loader(r, seq_len=5, global_batch_size=300, mode="unpacked", long_docs="error")
    with pytest.raises(InvalidInputError, match="more than seq_len"):
        strict.batch(0)


def test_options_dtype_bos_and_pad(dataset):
    r, _ = dataset
    a = Loader(r, seq_len=16, global_batch_size=4, seed=2)
    b = Loader(r, seq_len=16, global_batch_size=4, seed=2, dtype="int64", bos_id=7)
    x, y = a.batch(3), b.batch(3)
    assert y["inputs"].dtype == np.int64 and y["targets"].dtype == np.int64
    starts = x["positions"] == 0
    assert (y["inputs"][starts] == 7).all()
    assert np.array_equal(x["inputs"][~starts], y["inputs"][~starts])
    u = Loader(r, seq_len=64, global_batch_size=4, mode="unpacked", pad_id=-1, bos_id=5)
    z = u.batch(0)
    assert (z["targets"][~z["loss_mask"]] == -1).all() and (
        z["inputs"][:, 0][z["loss_mask"][:, 0]] == 5
    ).all()
    with pytest.raises(InvalidInputError, match="dtype"):
        Loader(r, seq_len=16, global_batch_size=4, dtype="float32")


def test_old_names_still_work_with_a_warning_at_the_callers_line(dataset):
    r, _ = dataset
    with pytest.warns(DeprecationWarning, match=r"batch_size=B.*0\.3.*global_batch_size") as w:
        old = Loader(r, seq_len=8, batch_size=3, rank=1, world_size=2, seed=4)
    assert w[0].filename == __file__  # the warning names the caller's line, not lmdata's
    new = Loader(r, seq_len=8, global_batch_size=6, rank=1, world_size=2, seed=4)
    assert np.array_equal(old.batch(2)["targets"], new.batch(2)["targets"])
    with pytest.warns(DeprecationWarning, match="mode='unpacked'"):
        assert Loader(r, seq_len=8, global_batch_size=2, packed=False).config.mode == "unpacked"
    with pytest.warns(DeprecationWarning, match="long_docs='error'"):
        assert Loader(r, seq_len=8, global_batch_size=2, truncate=False).config.long_docs == "error"
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(InvalidInputError, match="global_batch_size"),
    ):
        Loader(r, seq_len=8, batch_size=2, global_batch_size=4)


def test_an_unknown_option_names_the_valid_ones(dataset):
    r, _ = dataset
    with pytest.raises(InvalidInputError, match="did you mean 'global_batch_size'") as e:
        Loader(r, seq_len=8, global_batchsize=2)
    msg = str(e.value)
    assert "lmdata.Loader takes" in msg and "seq_len" in msg and "long_docs" in msg
    assert "truncate" not in msg and "packed," not in msg  # deprecated names are not offered


def test_option_types_are_the_literals_the_config_checks():
    import typing

    from lmdata.loader.config import Dtype, LongDocs, Mode
    from lmdata.loader.sources import LONG_DOCS, MODES

    assert typing.get_args(Mode) == MODES and typing.get_args(LongDocs) == LONG_DOCS
    assert typing.get_args(Dtype) == ("int32", "int64")
    hints = typing.get_type_hints(Loader.__init__)
    assert hints["mode"] is Mode and hints["dtype"] is Dtype


def test_paths_and_token_columns(tmp_path):
    seqs = random_seqs(1, 40)
    write_flat(tmp_path / "f.zarr", seqs)
    a = Loader(str(tmp_path / "f.zarr"), seq_len=8, global_batch_size=2, shuffle=False)
    assert a.batch(0)["targets"].ravel().tolist() == np.concatenate(seqs)[:16].tolist()

    class Records:  # a record dataset holding tokens in a column (as Atlas or MDS do)
        def __init__(self, items):
            self.items = items

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

        def take(self, idx):
            return [self.items[int(i)] for i in idx]

        def __iter__(self):
            return iter(self.items)

    recs = Records([{"text": "x", "ids": np.asarray(s)} for s in seqs])
    b = Loader(recs, seq_len=8, global_batch_size=2, shuffle=False, token_column="ids")
    assert np.array_equal(b.batch(5)["inputs"], a.batch(5)["inputs"])
    with pytest.raises(InvalidInputError, match="token_column"):
        Loader(recs, seq_len=8, global_batch_size=2)
    with pytest.raises(InvalidInputError, match="no column 'tokens'"):
        Loader(recs, seq_len=8, global_batch_size=2, token_column="tokens")


def test_modalities_source(tmp_path):
    from lmdata.formats.modalities import Writer as PbinWriter

    seqs = random_seqs(2, 30)
    with PbinWriter(tmp_path / "m.pbin") as w:
        for s in seqs:
            w.write(s)
    r = lmdata.open(tmp_path / "m.pbin")
    loader = Loader(r, seq_len=10, global_batch_size=3, mode="eos", shuffle=False)
    flat = np.concatenate([np.asarray(r[i]) for i in range(len(r))])
    assert loader.batch(1)["targets"][0].tolist() == flat[31:41].tolist()


def test_a_corrupt_chunk_is_the_librarys_error_naming_the_file(tmp_path):
    seqs = random_seqs(3, 200)
    r = write_flat(tmp_path / "c.zarr", seqs, chunk_tokens=64)
    chunk = tmp_path / "c.zarr" / "train" / "encoded_tokens" / "1"
    chunk.write_bytes(chunk.read_bytes()[:10])
    loader = Loader(
        lmdata.open(tmp_path / "c.zarr"), seq_len=32, global_batch_size=2, shuffle=False
    )
    with pytest.raises(CorruptDataError, match="encoded_tokens"):
        loader.batch(1)
    del r


def test_bad_configuration_is_a_clear_error(dataset):
    r, _ = dataset
    with pytest.raises(InvalidInputError, match="seq_len"):
        Loader(r, seq_len=0, global_batch_size=2)
    with pytest.raises(InvalidInputError, match="no rows"):
        Loader(r, seq_len=10**9, global_batch_size=2)
    with pytest.raises(InvalidInputError, match="mode"):
        Loader(r, seq_len=8, global_batch_size=2, mode="pack")
    with pytest.raises(InvalidInputError, match="step"):
        Loader(r, seq_len=8, global_batch_size=2).batch(-1)
    with pytest.raises(InvalidInputError, match="sizes"):
        Loader([r, r], seq_len=8, global_batch_size=2, epochs=1, weights=[1, 2])
    for bad in ("0", 0.0, True):
        with pytest.raises(InvalidInputError, match="rank must be an integer"):
            Loader(r, seq_len=8, global_batch_size=2, rank=bad, world_size=1)
    with pytest.raises(InvalidInputError, match="world_size must be an integer"):
        Loader(r, seq_len=8, global_batch_size=2, rank=0, world_size="2")


def test_prefetch_gives_the_same_batches(dataset):
    r, _ = dataset
    a = Loader(r, seq_len=8, global_batch_size=4, seed=1, epochs=2)
    b = Loader(r, seq_len=8, global_batch_size=4, seed=1, epochs=2, prefetch=3)
    xs, ys = list(a), list(b)
    assert len(xs) == len(ys) == len(a) and b.step == len(b)
    for x, y in zip(xs, ys, strict=True):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    # an error in the prefetch thread reaches the consumer
    bad = Loader(r, seq_len=8, global_batch_size=4, prefetch=2)
    bad.batch = None  # type: ignore[assignment]
    with pytest.raises(TypeError):
        next(iter(bad))


def test_open_does_not_read_seq_starts_in_packed_mode(dataset):
    r, _ = dataset
    loader = Loader(r, seq_len=8, global_batch_size=4, seed=1)
    loader.batch(5)
    loader.batch(1000)
    assert r._boundaries is None  # packed rows came from the start bits alone


def test_mds_and_atlas_sources_give_the_same_batches(tmp_path):
    seqs = [s for s in random_seqs(5, 40) if len(s)]
    ref = Loader(Plain(seqs), seq_len=8, global_batch_size=4, seed=1)
    with lmdata.writer(tmp_path / "m", "mds", columns={"tokens": "ndarray:uint32"}) as w:
        for s in seqs:
            w.write({"tokens": np.asarray(s, dtype=np.uint32)})
    with lmdata.writer(tmp_path / "a", "atlas") as w:
        for s in seqs:
            w.write({"tokens": np.asarray(s, dtype=np.int64)})
    with pytest.raises(InvalidInputError, match="token_column"):  # MDS opens as records
        Loader(str(tmp_path / "m"), seq_len=8, global_batch_size=4, seed=1)
    mds = Loader(str(tmp_path / "m"), seq_len=8, global_batch_size=4, seed=1, token_column="tokens")
    atlas = Loader(
        str(tmp_path / "a"), seq_len=8, global_batch_size=4, seed=1, token_column="tokens"
    )
    for step in (0, 5, 33):
        want = ref.batch(step)
        for got in (mds.batch(step), atlas.batch(step)):
            assert all(np.array_equal(got[k], want[k]) for k in want)


class _CountingPlain(Plain):
    """A protocol-only reader that counts what the loader asks of it."""

    def __init__(self, seqs: list) -> None:
        self.boundary_reads = 0
        self.spans: list[int] = []
        super().__init__(seqs)

    @property
    def boundaries(self):
        self.boundary_reads += 1
        return self._b

    @boundaries.setter
    def boundaries(self, b) -> None:
        self._b = b

    def span(self, a: int, b: int) -> np.ndarray:
        self.spans.append(b - a)
        return super().span(a, b)

    def take(self, idx) -> list:
        raise AssertionError("unpacked rows read whole documents")


def test_generic_packed_reads_convert_the_boundaries_once():
    r = _CountingPlain(random_seqs(6, 80))
    loader = Loader(r, seq_len=8, global_batch_size=4, seed=3)
    for s in range(30):
        loader.batch(s)
    assert r.boundary_reads == 1


def test_truncated_unpacked_rows_read_only_what_they_keep(tmp_path):
    seqs = [np.arange(1, n + 1) for n in (3, 50, 9, 400, 12)]
    r = _CountingPlain(seqs)
    b = Loader(r, seq_len=10, global_batch_size=5, mode="unpacked", shuffle=False).batch(0)
    assert max(r.spans) <= 10 and sum(r.spans) == 3 + 10 + 9 + 10 + 10
    assert b["targets"][3].tolist() == list(range(1, 11))
    f = write_flat(tmp_path / "u.zarr", seqs)
    fb = Loader(f, seq_len=10, global_batch_size=5, mode="unpacked", shuffle=False).batch(0)
    assert all(np.array_equal(fb[k], b[k]) for k in b)
    assert f._boundaries is None  # two index entries per document, never the whole index
    with pytest.raises(InvalidInputError, match=r"document 1 .* 50 tokens"):
        Loader(
            r, seq_len=10, global_batch_size=5, mode="unpacked", long_docs="error", shuffle=False
        ).batch(0)


def _big_endian_copy(src: Path, dst: Path) -> object:
    """The flat-tokens store ``src`` with its tokens stored big-endian (``>u4``)."""
    import json
    import shutil

    shutil.copytree(src, dst)
    arr = dst / "train" / "encoded_tokens"
    meta = json.loads((arr / ".zarray").read_text())
    meta["dtype"] = ">u4"
    (arr / ".zarray").write_text(json.dumps(meta))
    for f in arr.iterdir():
        if not f.name.startswith("."):
            f.write_bytes(np.fromfile(f, dtype="<u4").astype(">u4").tobytes())
    return lmdata.open(dst)


@pytest.mark.parametrize("seq_len", [8, 16, 12])  # rows aligned to the 256-token chunks, or not
def test_gathered_rows_equal_the_tokens_in_either_byte_order(tmp_path, seq_len):
    seqs = random_seqs(4, 120)
    little = write_flat(tmp_path / "le.zarr", seqs)
    big = _big_endian_copy(tmp_path / "le.zarr", tmp_path / "be.zarr")
    plain = Plain(seqs)
    kw = {"seq_len": seq_len, "global_batch_size": 6, "seed": 5}
    loaders = [Loader(x, **kw) for x in (little, big, plain)]
    stream = plain.flat
    for step in range(12):
        want = loaders[2].batch(step)
        rows = loaders[0].indices(step)[1]
        expect = np.stack([stream[r * seq_len : (r + 1) * seq_len] for r in rows.tolist()])
        assert np.array_equal(want["targets"], expect)
        for got in (loaders[0].batch(step), loaders[1].batch(step)):
            assert all(np.array_equal(got[k], want[k]) for k in want), step


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    L=st.integers(1, 12),
    long_docs=st.sampled_from(["truncate", "split"]),
    pad_id=st.sampled_from([0, -100]),
)
def test_unpacked_rows_from_stored_windows_equal_the_generic_path(lens, L, long_docs, pad_id):
    """The flat-tokens unpacked path (one gather of L stored tokens per row, pieces near the
    end moved into place) gives the generic reader's rows: every row of a finite pass."""
    seqs = [np.arange(1, n + 1) * 7 + i for i, n in enumerate(lens)]
    if sum(lens) == 0:
        return
    with tempfile.TemporaryDirectory() as d:
        flat = write_flat(Path(d) / "u.zarr", seqs, chunk_tokens=8)
        kw = {"seq_len": L, "global_batch_size": 3, "mode": "unpacked", "long_docs": long_docs}
        kw |= {"epochs": 1, "shuffle": False, "pad_id": pad_id, "bos_id": 5}
        a, b = Loader(flat, **kw), Loader(Plain(seqs), **kw)
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys()
            assert all(np.array_equal(x[k], y[k]) for k in x)
        flat.close()


def test_a_corrupt_index_entry_is_named_by_unpacked_reads(tmp_path):
    seqs = random_seqs(8, 20, max_len=20)
    write_flat(tmp_path / "c.zarr", seqs, chunk_tokens=64)
    f = tmp_path / "c.zarr" / "train" / "seq_starts" / "0"
    starts = np.fromfile(f, dtype="<u8")
    starts[3] = starts[-1] + 5  # past the tokens (first and last entries intact: opens)
    starts.tofile(f)
    loader = Loader(lmdata.open(tmp_path / "c.zarr"), seq_len=8, global_batch_size=20)
    with pytest.raises(CorruptDataError, match=r"seq_starts\[[23]:[45]\]"):
        Loader(
            lmdata.open(tmp_path / "c.zarr"),
            seq_len=8,
            global_batch_size=20,
            mode="unpacked",
            shuffle=False,
        ).batch(0)
    assert loader.batch(0)["targets"].shape == (20, 8)  # packed reads never use the index


def test_packed_pbin_rows_with_empty_documents(tmp_path):
    # the generic packed path reads every document start, empty ones included (repeats)
    import struct

    from lmdata.formats._span_index import dump_span_index

    tokens = np.arange(1, 21, dtype="<u2")
    spans = [(0, 3), (3, 0), (3, 0), (3, 5), (8, 0), (8, 12), (20, 0)]
    raw = struct.pack("<QI", 40, 2) + tokens.tobytes()
    raw += dump_span_index([2 * a for a, _ in spans], [2 * n for _, n in spans])
    p = tmp_path / "e.pbin"
    p.write_bytes(raw)
    r = lmdata.open(p)
    assert r.boundaries.tolist() == [0, 3, 3, 3, 8, 8, 20, 20]
    got = Loader(r, seq_len=5, global_batch_size=4, shuffle=False).batch(0)
    want = Loader(
        Plain([tokens[:3], tokens[3:8], tokens[8:]]), seq_len=5, global_batch_size=4, shuffle=False
    ).batch(0)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    assert got["segment_ids"][0].tolist() == [1, 1, 1, 2, 2]
    assert got["positions"][1].tolist() == [0, 1, 2, 0, 1]  # each row starts a segment


@pytest.mark.parametrize("mode", ["packed", "eos", "unpacked", "bestfit"])
def test_drop_last_serves_whole_batches_of_full_rows_only(dataset, mode):
    r, seqs = dataset
    flat = np.concatenate(seqs)
    L, g = 16, 7
    kw = {"seq_len": L, "global_batch_size": g, "shuffle": False, "epochs": 1, "mode": mode}
    padded, dropped = Loader(r, **kw), Loader(r, drop_last=True, **kw)
    # packed/eos: full rows; unpacked: documents; bestfit: its layout's rows
    full_rows = dropped.sources[0].num_rows
    assert len(dropped) == full_rows // g and len(dropped) < len(padded)
    batches = list(dropped)
    assert len(batches) == len(dropped)
    for b in batches:
        assert b["targets"].shape == (g, L)
        if mode != "unpacked":  # nothing padded, so no mask: the keys of a training batch
            assert set(b) == set(Loader(r, seq_len=L, global_batch_size=g, mode=mode).batch(0))
    if mode == "packed":  # in order: the stream's first len * g full rows, nothing else
        got = np.concatenate([b["targets"].ravel() for b in batches])
        assert np.array_equal(got, flat[: len(batches) * g * L])
    # the same rows as the padded pass up to where it stops
    for s in range(len(dropped)):
        if mode != "packed":
            assert np.array_equal(dropped.batch(s)["targets"], padded.batch(s)["targets"])
    with pytest.raises(InvalidInputError, match="finite pass"):
        Loader(r, seq_len=L, global_batch_size=g, drop_last=True)
    with pytest.raises(InvalidInputError, match="drop_last must be True or False"):
        Loader(r, seq_len=L, global_batch_size=g, epochs=1, drop_last="no")
    with pytest.raises(InvalidInputError, match="leaves no batch"):
        Loader(r, seq_len=L, global_batch_size=10**6, epochs=1, drop_last=True)
    state = padded.state_dict()
    with pytest.raises(InvalidInputError, match="drop_last False saved, True here"):
        Loader(r, drop_last=True, **kw).load_state_dict(state)


def test_drop_last_over_a_mixture_serves_whole_batches_without_repeats(dataset, tmp_path):
    r, _ = dataset
    other = write_flat(tmp_path / "o.zarr", random_seqs(9, 200))
    ld = Loader([r, other], seq_len=8, global_batch_size=6, epochs=1, drop_last=True, seed=2)
    seen = set()
    for step in range(len(ld)):
        src, rows, valid = ld.indices(step)
        assert valid.all() and len(rows) == 6
        pairs = set(zip(src.tolist(), rows.tolist(), strict=True))
        assert len(pairs) == 6 and not pairs & seen
        seen |= pairs
        assert "loss_mask" not in ld.batch(step)
    assert len(seen) == (ld.num_rows // 6) * 6  # only the incomplete last batch is left out
