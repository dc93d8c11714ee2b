"""Formats that reach bytes only through stores: the same round trip on disk and memory://,
atomic commits (a failed or abandoned writer leaves nothing a reader accepts), fork and spawn."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import LmdataError

SEQS = st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=40), max_size=30)


def _write_tokens(where, seqs, **kw):
    with lmdata.writer(where, "flat-tokens", **kw) as w:
        for s in seqs:
            w.write(np.asarray(s, dtype=np.int64))
    return where


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_flat_tokens_round_trip(where, compression):
    seqs = [list(range(i, 3 * i)) for i in range(25)]
    _write_tokens(where, seqs, chunk_tokens=64, seq_starts_chunk=8, compression=compression)
    r = lmdata.open(where)
    assert [x.tolist() for x in r] == seqs
    assert [x.tolist() for x in r.take([24, 0, 7])] == [seqs[24], seqs[0], seqs[7]]
    flat = np.concatenate([np.asarray(s) for s in seqs])
    assert r.span(5, 300).tolist() == flat[5:300].tolist()
    rows = r.packed_rows([3, 0, 5], 16) >> 1
    assert rows.tolist() == [flat[r0 * 16 : r0 * 16 + 16].tolist() for r0 in (3, 0, 5)]
    assert lmdata.validate(where) == []
    assert lmdata.info(where)["splits"]["train"]["sequences"] == 25
    assert lmdata.detect(where) == "flat-tokens"
    copy = pickle.loads(pickle.dumps(r))
    assert copy[10].tolist() == seqs[10]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seqs=SEQS)
def test_flat_tokens_memory_round_trip_any_sequences(memory_root, seqs):
    where = f"{memory_root}/h{abs(hash(str(seqs))) % 10**9}"
    _write_tokens(where, seqs, chunk_tokens=32)
    r = lmdata.open(where)
    assert [x.tolist() for x in r] == seqs
    assert lmdata.validate(where) == []


def test_flat_tokens_failed_writer_leaves_nothing(where):
    with pytest.raises(RuntimeError), lmdata.writer(where, "flat-tokens", chunk_tokens=8) as w:
        w.write(np.arange(100))
        raise RuntimeError("killed")
    with pytest.raises(LmdataError):
        lmdata.open(where, format="flat-tokens")


def test_flat_tokens_abandoned_writer_is_never_readable(where):
    """A writer that never closes (a killed process) has written data but no metadata."""
    w = lmdata.writer(where, "flat-tokens", chunk_tokens=8)
    w.write(np.arange(100))
    w.write(np.arange(50), split="validation")
    with pytest.raises(LmdataError):
        lmdata.open(where, format="flat-tokens")
    with pytest.raises(LmdataError):
        lmdata.open(where)
    if _exists(where):  # object stores: data objects under final names, no metadata
        assert lmdata.validate(where, format="flat-tokens") != []
    w.abort()
    assert not _exists(where)


def _exists(where):
    from lmdata.storage import resolve

    store, key = resolve(where)
    return store.exists(key)


def _read_in_child(reader, q):
    q.put([reader[i].tolist() for i in range(len(reader))])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_flat_tokens_reader_works_in_forked_and_spawned_children(where, method):
    if method == "spawn" and where.startswith("memory://"):
        pytest.skip("memory:// holds data in this process only")
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} here")
    seqs = [list(range(i + 1)) for i in range(30)]
    _write_tokens(where, seqs, chunk_tokens=16, compression="zstd")
    r = lmdata.open(where)
    assert r[3].tolist() == seqs[3]  # the parent has opened files and filled caches
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_read_in_child, args=(r, q))
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0 and got == seqs
    assert [x.tolist() for x in r] == seqs  # and the parent still reads correctly


RECORDS = [{"id": i, "text": f"document {i} " * (i % 7)} for i in range(120)]


@pytest.mark.parametrize(
    ("fmt", "opts"),
    [
        ("mds", {}),
        ("mds", {"compression": "zstd", "hashes": ["xxh64"]}),
        ("mds-jsonl", {}),
        ("mds-csv", {"compression": "zstd"}),
    ],
)
def test_mds_round_trip(where, fmt, opts):
    with lmdata.writer(where, fmt, size_limit=600, **opts) as w:
        for rec in RECORDS:
            w.write(rec)
    r = lmdata.open(where)
    assert r.format == fmt and len(r) == len(RECORDS)
    assert [int(x["id"]) for x in r] == list(range(120))
    assert r[77]["text"] == RECORDS[77]["text"]
    assert [x["id"] for x in r.take([5, 119, 0])] in ([5, 119, 0], ["5", "119", "0"])
    assert lmdata.validate(where) == []
    assert lmdata.info(where)["samples"] == 120
    assert pickle.loads(pickle.dumps(r))[33]["text"] == RECORDS[33]["text"]


def test_mds_tokens_on_stores(where):
    seqs = [np.arange(i, dtype=np.int32) for i in range(1, 40)]
    with lmdata.writer(where, "mds") as w:
        for s in seqs:
            w.write({"tokens": s})
    r = lmdata.open(where, token_column="tokens")
    assert [x.tolist() for x in r] == [s.tolist() for s in seqs]


def test_mds_failed_or_abandoned_writer_leaves_nothing_readable(where):
    with pytest.raises(RuntimeError), lmdata.writer(where, "mds", size_limit=300) as w:
        for rec in RECORDS:
            w.write(rec)
        raise RuntimeError("killed")
    with pytest.raises(LmdataError):
        lmdata.open(where, format="mds")
    w = lmdata.writer(where, "mds", size_limit=300)
    for rec in RECORDS:
        w.write(rec)  # shards land under their final names on object stores...
    with pytest.raises(LmdataError):
        lmdata.open(where, format="mds")  # ...but without index.json nothing opens
    w.abort()
    assert not _exists(where)


def _read_records_in_child(reader, q):
    q.put([reader[i]["text"] for i in range(len(reader))])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_mds_reader_works_in_forked_and_spawned_children(where, method):
    if method == "spawn" and where.startswith("memory://"):
        pytest.skip("memory:// holds data in this process only")
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} here")
    with lmdata.writer(where, "mds", size_limit=500, compression="zstd") as w:
        for rec in RECORDS:
            w.write(rec)
    r = lmdata.open(where)
    assert r[3]["text"] == RECORDS[3]["text"]
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_read_records_in_child, args=(r, q))
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0 and got == [x["text"] for x in RECORDS]


@pytest.fixture
def fetched(monkeypatch):
    """Counts the bytes FsspecStore hands to readers (ranged and whole reads)."""
    from lmdata.storage import FsspecStore

    counter = {"bytes": 0}
    for name in ("read_range", "read", "read_ranges"):
        orig = getattr(FsspecStore, name)

        def wrapped(self, *a, _orig=orig, **kw):
            out = _orig(self, *a, **kw)
            counter["bytes"] += sum(map(len, out)) if isinstance(out, list) else len(out)
            return out

        monkeypatch.setattr(FsspecStore, name, wrapped)
    return counter


def test_small_remote_reads_fetch_ranges_not_objects(memory_root, fetched):
    """One row of an uncompressed 4 MiB chunk, one sample of a 1 MiB MDS shard: the bytes
    fetched after opening are a small multiple of the bytes used, never the whole object."""
    ft = f"{memory_root}/ft"
    _write_tokens(ft, [np.arange(1 << 20)], chunk_tokens=1 << 20)
    r = lmdata.open(ft)
    fetched["bytes"] = 0
    assert (r.packed_rows([100], 256) >> 1).tolist() == [list(range(25600, 25856))]
    assert r.span(1000, 1010).tolist() == list(range(1000, 1010))
    assert fetched["bytes"] <= 4 * (256 + 10)
    mds = f"{memory_root}/mds"
    with lmdata.writer(mds, "mds", size_limit=None) as w:
        for i in range(1000):
            w.write({"id": i, "text": "x" * 1000})
    m = lmdata.open(mds)
    m[0]  # the offsets table, once per shard
    fetched["bytes"] = 0
    assert m[500]["id"] == 500
    assert fetched["bytes"] < 1100


# ---- modalities .pbin ------------------------------------------------------------------------


def _write_pbin(where, docs, **kw):
    with lmdata.writer(where, "modalities", **kw) as w:
        for d in docs:
            w.write(np.asarray(d, dtype=np.int64))
    return where


@pytest.mark.parametrize("width", [None, 1, 4])
def test_pbin_round_trip(where, width):
    where = f"{where}.pbin"
    docs = [list(range(i % 200, i % 200 + i % 9)) for i in range(60)]
    _write_pbin(where, docs, token_width=width, eod_id=0)
    r = lmdata.open(where)
    want = [[*d, 0] if not d or d[-1] != 0 else d for d in docs]
    assert r.token_width == (width or 1)
    assert [x.tolist() for x in r] == want
    assert [x.tolist() for x in r.take([59, 0, 31])] == [want[59], want[0], want[31]]
    flat = [t for d in want for t in d]
    assert r.span(7, 123).tolist() == flat[7:123]
    assert lmdata.validate(where, eod_id=0) == []
    info = lmdata.info(where)
    assert info["documents"] == 60 and info["tokens"] == len(flat)
    assert lmdata.detect(where) == "modalities"
    assert pickle.loads(pickle.dumps(r))[40].tolist() == want[40]


def test_pbin_detected_by_content_without_suffix(where):
    _write_pbin(where, [[1, 2, 3], [4]])
    assert lmdata.detect(where) == "modalities"
    assert [x.tolist() for x in lmdata.open(where, format="modalities")] == [[1, 2, 3], [4]]


def test_pbin_failed_or_abandoned_writer_leaves_nothing(where):
    where = f"{where}.pbin"
    with pytest.raises(RuntimeError), lmdata.writer(where, "modalities") as w:
        w.write(np.arange(10))
        raise RuntimeError("killed")
    assert not _exists(where)
    w = lmdata.writer(where, "modalities")
    w.write(np.arange(10))
    assert not _exists(where)  # the object appears whole, at commit
    w.abort()
    assert not _exists(where)


def test_pbin_corrupt_on_store_is_an_lmdata_error(where):
    from lmdata.storage import resolve

    where = f"{where}.pbin"
    _write_pbin(where, [list(range(50))] * 3, token_width=2)
    store, key = resolve(where)
    raw = store.read(key)
    out = store.output(key, directory=False, overwrite=True)
    out.write("", raw[:-40])  # the index cut short
    out.commit()
    with pytest.raises(LmdataError):
        lmdata.open(where)
    assert lmdata.validate(where) != []


def test_pbin_remote_reads_fetch_ranges_not_objects(memory_root, fetched):
    where = f"{memory_root}/big.pbin"
    _write_pbin(where, [np.arange(i * 1000, (i + 1) * 1000) for i in range(256)], token_width=4)
    r = lmdata.open(where)
    fetched["bytes"] = 0
    assert r[100].tolist() == list(range(100_000, 101_000))
    assert [x[0] for x in r.take([3, 200])] == [3000, 200_000]
    assert fetched["bytes"] <= 3 * 4000


# ---- atlas -----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_atlas_round_trip(where, strategy):
    with lmdata.writer(
        where, "atlas", shard_size=50, block_size=4, compression_strategy=strategy
    ) as w:
        for rec in RECORDS:
            w.write(rec)
    r = lmdata.open(where)
    assert r.format == "atlas" and len(r) == len(RECORDS)
    assert list(r) == RECORDS
    assert r[77] == RECORDS[77] and r[-1] == RECORDS[-1]
    assert r.take([5, 119, 0, 5]) == [RECORDS[5], RECORDS[119], RECORDS[0], RECORDS[5]]
    assert lmdata.validate(where) == []
    info = lmdata.info(where)
    assert info["examples"] == 120 and info["shards"] == 3
    assert lmdata.detect(where) == "atlas"
    assert pickle.loads(pickle.dumps(r))[33] == RECORDS[33]


def test_atlas_failed_or_abandoned_writer_leaves_nothing(where):
    with pytest.raises(RuntimeError), lmdata.writer(where, "atlas", shard_size=30) as w:
        for rec in RECORDS:
            w.write(rec)
        raise RuntimeError("killed")
    assert not _exists(where)
    w = lmdata.writer(where, "atlas", shard_size=30)
    for rec in RECORDS:
        w.write(rec)
    with pytest.raises(LmdataError):
        lmdata.open(where, format="atlas")
    w.abort()
    assert not _exists(where)


def test_atlas_damage_on_a_store_is_reported(where):
    from lmdata.storage import join, resolve

    with lmdata.writer(where, "atlas", shard_size=50, block_size=4) as w:
        for rec in RECORDS:
            w.write(rec)
    store, key = resolve(where)
    data = join(key, "1", "data.bin")
    raw = store.read(data)
    store.remove(data)
    with pytest.raises(LmdataError, match=r"data\.bin"):
        lmdata.open(where)[60]
    assert any("data.bin" in p for p in lmdata.validate(where))
    store.remove(join(key, "meta.json"))
    with pytest.raises(LmdataError, match="cannot tell the format"):
        lmdata.detect(where)
    assert raw


def test_atlas_remote_reads_fetch_blocks_not_shards(memory_root, fetched):
    where = f"{memory_root}/atlas"
    with lmdata.writer(where, "atlas", block_size=8, compression_strategy=0) as w:
        for i in range(2000):
            w.write({"i": i, "text": "x" * 500})
    r = lmdata.open(where)
    r[0]  # the shard's index, once
    fetched["bytes"] = 0
    assert r[1500]["i"] == 1500
    assert fetched["bytes"] < 8 * 600


# ---- modalities-jsonl and plain jsonl ------------------------------------------------------


@pytest.mark.parametrize("fmt", ["modalities-jsonl", "jsonl"])
def test_jsonl_round_trip(where, fmt):
    where = f"{where}.jsonl"
    with lmdata.writer(where, fmt) as w:
        for rec in RECORDS:
            w.write(rec)
    r = lmdata.open(where, format=fmt)
    assert len(r) == 120 and list(r) == RECORDS
    assert r[77] == RECORDS[77] and r.take([5, 119, 0]) == [RECORDS[i] for i in (5, 119, 0)]
    assert lmdata.validate(where, format=fmt) == []
    assert lmdata.info(where, format=fmt)["documents"] == 120
    assert lmdata.detect(where) == fmt  # the .idx beside it decides
    assert pickle.loads(pickle.dumps(r))[33] == RECORDS[33]


def test_modalities_jsonl_index_is_committed_last(where):
    """Data first, index last; a writer killed before its index leaves data no reader takes."""
    where = f"{where}.jsonl"
    with lmdata.writer(where, "modalities-jsonl") as w:
        w.write({"a": 1})
    w = lmdata.writer(where, "modalities-jsonl", overwrite=True)
    w.write({"b": 2})
    # the old pair stays readable until the new one commits (locally: renames; on stores: the
    # new objects are staged under temporary names and copied into place at commit)
    assert list(lmdata.open(where, format="modalities-jsonl")) == [{"a": 1}]
    w.close()
    assert list(lmdata.open(where, format="modalities-jsonl")) == [{"b": 2}]


def test_modalities_jsonl_stale_index_on_a_store_is_refused(where):
    from lmdata.storage import resolve

    where = f"{where}.jsonl"
    with lmdata.writer(where, "modalities-jsonl") as w:
        for rec in RECORDS[:10]:
            w.write(rec)
    store, key = resolve(where)
    out = store.output(key, directory=False, overwrite=True)
    out.write("", b'{"x": 1}\n')  # the data replaced, the index kept
    out.commit()
    with pytest.raises(LmdataError):
        lmdata.open(where, format="modalities-jsonl")
    assert lmdata.validate(where, format="modalities-jsonl") != []


def test_jsonl_remote_reads_fetch_lines_not_objects(memory_root, fetched):
    where = f"{memory_root}/big.jsonl"
    with lmdata.writer(where, "modalities-jsonl") as w:
        for i in range(2000):
            w.write({"i": i, "text": "y" * 300})
    r = lmdata.open(where, format="modalities-jsonl")
    fetched["bytes"] = 0
    assert r[1234]["i"] == 1234 and [x["i"] for x in r.take([7, 1999])] == [7, 1999]
    assert fetched["bytes"] < 3 * 400


def test_modalities_jsonl_kill_mid_swap_leaves_no_index_and_the_journal_finishes(monkeypatch):
    """On a store, a replaced pair is swapped under one journal, the old index out first: a
    writer dying after the new data is in place leaves data with no index (refused), never new
    lines under the old index; settling its claim finishes the swap (the new pair)."""
    from lmdata.storage import claims, clean

    where = f"memory://lmdata-kill-{os.getpid()}/d.jsonl"
    with lmdata.writer(where, "modalities-jsonl") as w:
        w.write({"a": "x"})
    w = lmdata.writer(where, "modalities-jsonl", overwrite=True)
    w.write({"a": "y"})  # same line length: an old index would read it silently
    put_moves = claims.put_moves

    def die(store, gone, moves):
        put_moves(store, gone, moves[:1])  # the old index out, the new data in: then killed
        raise KeyboardInterrupt

    monkeypatch.setattr(claims, "put_moves", die)
    with pytest.raises(KeyboardInterrupt):
        w.close()
    monkeypatch.undo()
    with pytest.raises(LmdataError):
        list(lmdata.open(where, format="modalities-jsonl"))
    clean(where.rsplit("/", 1)[0], claims=True)  # this process's writer is gone: at once
    assert list(lmdata.open(where, format="modalities-jsonl")) == [{"a": "y"}]


def test_a_folder_named_like_jsonl_is_a_format_error(tmp_path):
    (tmp_path / "d.jsonl").mkdir()
    for fmt in ("jsonl", "modalities-jsonl"):
        with pytest.raises(LmdataError, match="one file"):
            lmdata.open(tmp_path / "d.jsonl", format=fmt)
        problems = lmdata.validate(tmp_path / "d.jsonl", format=fmt)
        assert problems and "one file" in problems[0]
