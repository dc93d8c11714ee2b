"""The ``.pbin`` index sidecar: built once, mapped on later opens, never trusted blindly."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata import _pickle
from lmdata.formats.modalities import PackedTokens, Writer, sidecar


@pytest.fixture(autouse=True)
def always_sidecar(monkeypatch, tmp_path):
    """Sidecars for any index size, and a private cache folder."""
    monkeypatch.setattr(sidecar, "MIN_INDEX_BYTES", 0)
    monkeypatch.setenv(sidecar.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture
def no_unpickling(monkeypatch):
    def refuse(self):
        raise AssertionError("the index was unpickled")

    def arm():
        monkeypatch.setattr(_pickle._SafeUnpickler, "load", refuse)

    return arm


def write(path, seqs, **kw) -> str:
    kw.setdefault("manifest", False)  # these tests count the files beside a .pbin
    with Writer(path, **kw) as w:
        for s in seqs:
            w.write(np.asarray(s, dtype=np.int64))
    return str(path)


def seqs_of(seed: int, n: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 500, rng.integers(1, 30)) for _ in range(n)]


def contents(r: PackedTokens) -> list[list[int]]:
    return [r[i].tolist() for i in range(len(r))]


def side(path) -> Path:
    return Path(str(path) + sidecar.SUFFIX)


def test_second_open_maps_the_sidecar_and_does_not_unpickle(tmp_path, no_unpickling):
    seqs = seqs_of(0)
    p = write(tmp_path / "a.pbin", seqs)
    first = PackedTokens(p)
    assert side(p).is_file()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".lmdata-tmp-")]
    no_unpickling()
    second = PackedTokens(p)
    assert isinstance(second.doc_starts.base, np.memmap)
    assert contents(second) == [s.tolist() for s in seqs] == contents(first)
    assert np.array_equal(second.boundaries, first.boundaries)
    assert second.boundaries.dtype == np.uint64 and second.doc_lengths.dtype == np.int64
    assert second.contiguous and second.info() == first.info()


def test_small_indexes_get_no_sidecar(tmp_path, monkeypatch):
    monkeypatch.setattr(sidecar, "MIN_INDEX_BYTES", 1 << 20)
    p = write(tmp_path / "a.pbin", seqs_of(1))
    PackedTokens(p)
    assert os.listdir(tmp_path) == ["a.pbin"]


def test_a_changed_pbin_makes_the_sidecar_stale(tmp_path):
    p = write(tmp_path / "a.pbin", [[1, 2, 3], [4, 5], [6]])
    PackedTokens(p)
    old = side(p).read_bytes()
    # the same file size and token data, other document boundaries
    write(tmp_path / "a.pbin", [[1, 2], [3, 4, 5], [6]], overwrite=True)
    r = PackedTokens(p)
    assert contents(r) == [[1, 2], [3, 4, 5], [6]]
    assert side(p).read_bytes() != old  # rebuilt for the new index


def _hostile(raw: bytes) -> list[tuple[str, bytes]]:
    head = sidecar._HEADER.size
    n = struct.unpack_from("<Q", raw, 16)[0]

    def put(at: int, value: int) -> bytes:
        b = bytearray(raw)
        struct.pack_into("<q", b, at, value)
        return bytes(b)

    return [
        ("truncated", raw[:-8]),
        ("empty", b""),
        ("bad magic", b"X" + raw[1:]),
        ("bad key", raw[:48] + bytes(16) + raw[64:]),
        ("bad identity", raw[: head - 32] + bytes(16) + raw[head - 16 :]),
        ("huge count", put(16, 1 << 60)),
        ("start past the data", put(head + 8, 10**9)),
        ("negative start", put(head + 8, -5)),
        ("length past the data", put(head + 8 * n, 10**9)),
        ("boundaries not the running sum", put(head + 16 * n + 16, 2)),
        ("unknown flag", raw[:12] + b"\x08\x00\x00\x00" + raw[16:]),
    ]


@pytest.mark.parametrize("case", range(11))
def test_a_corrupt_or_hostile_sidecar_is_rebuilt(tmp_path, case):
    seqs = seqs_of(2, 5)
    p = write(tmp_path / "a.pbin", seqs)
    PackedTokens(p)
    good = side(p).read_bytes()
    name, bad = _hostile(good)[case]
    side(p).write_bytes(bad)
    r = PackedTokens(p)
    assert contents(r) == [s.tolist() for s in seqs], name
    assert side(p).read_bytes() == good, name


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_sidecar_path_that_is_no_file_never_blocks(tmp_path, kind, no_unpickling):
    seqs = seqs_of(3, 5)
    p = write(tmp_path / "a.pbin", seqs)
    if kind == "fifo":
        os.mkfifo(side(p))
    else:
        side(p).mkdir()
    assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]
    if kind == "fifo":  # replaced by a sidecar
        assert side(p).is_file()
    else:  # left alone: the sidecar went to the cache folder, and is used from there
        assert side(p).is_dir()
        assert len(os.listdir(tmp_path / "cache" / sidecar.CACHE_SUBDIR)) == 1
    no_unpickling()
    assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]


def test_a_read_only_folder_uses_the_cache_folder(tmp_path, monkeypatch, no_unpickling):
    seqs = seqs_of(4)
    data = tmp_path / "data"
    data.mkdir()
    p = write(data / "a.pbin", seqs)
    real_open = open

    def read_only(file, mode="r", *a, **kw):
        if Path(file).parent == data and mode != "r" and mode != "rb":
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr(sidecar, "open", read_only, raising=False)
    PackedTokens(p)
    assert os.listdir(data) == ["a.pbin"]
    (cached,) = (tmp_path / "cache" / sidecar.CACHE_SUBDIR).iterdir()
    assert cached.name.endswith("-a.pbin" + sidecar.SUFFIX)
    no_unpickling()
    assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_chmod_read_only_folder_uses_the_cache_folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    p = write(data / "a.pbin", seqs_of(5))
    data.chmod(0o555)
    try:
        PackedTokens(p)
        assert os.listdir(data) == ["a.pbin"]
    finally:
        data.chmod(0o755)
    assert len(os.listdir(tmp_path / "cache" / sidecar.CACHE_SUBDIR)) == 1


def test_object_store_pbin_uses_the_cache_folder(memory_root, tmp_path, no_unpickling):
    seqs = seqs_of(6)
    url = write(f"{memory_root}/a.pbin", seqs)
    first = contents(lmdata.open(url))
    assert len(os.listdir(tmp_path / "cache" / sidecar.CACHE_SUBDIR)) == 1
    no_unpickling()
    assert contents(lmdata.open(url)) == first == [s.tolist() for s in seqs]


def test_repaired_origin_merge_is_kept_and_not_served_unrepaired(tmp_path):
    # every offset 12 bytes short, as modalities' merge writes a file merged after another
    from lmdata.formats._span_index import dump_span_index

    a, b = [1, 2, 3], [4, 5]
    w = 2
    data = np.array(a + b, dtype="<u2").tobytes()
    idx = [(-12, 3 * w), (3 * w - 12, 2 * w)]
    raw = struct.pack("<QI", len(data), w) + data
    raw += dump_span_index([o for o, _ in idx], [n for _, n in idx])
    p = tmp_path / "m.pbin"
    p.write_bytes(raw)
    r = PackedTokens(p)
    assert r.repaired_origin_merge and contents(r) == [a, b]
    again = PackedTokens(p)
    assert again.repaired_origin_merge and contents(again) == [a, b]
    assert isinstance(again.doc_starts.base, np.memmap)
    with pytest.raises(lmdata.errors.CorruptDataError):
        PackedTokens(p, repair_origin_merge=False)  # never the sidecar's repaired index


def test_loader_batches_are_the_same_with_and_without_the_sidecar(tmp_path, monkeypatch):
    seqs = seqs_of(7, 200)
    p = write(tmp_path / "a.pbin", seqs)
    kw = dict(seq_len=16, global_batch_size=4, seed=3)
    monkeypatch.setattr(sidecar, "MIN_INDEX_BYTES", 1 << 40)
    plain = PackedTokens(p)
    assert not isinstance(plain.doc_starts.base, np.memmap)
    monkeypatch.setattr(sidecar, "MIN_INDEX_BYTES", 0)
    PackedTokens(p)
    mapped = PackedTokens(p)
    assert isinstance(mapped.doc_starts.base, np.memmap)
    for mode in ("packed", "eos", "unpacked"):
        a = lmdata.Loader(plain, mode=mode, **kw)
        b = lmdata.Loader(mapped, mode=mode, **kw)
        # the loader sees the mapped boundaries as they are: no private copy per worker
        assert np.shares_memory(b.sources[0]._boundaries(), mapped.boundaries)
        for step in (0, 1, 7):
            x, y = a.batch(step), b.batch(step)
            assert x.keys() == y.keys()
            for k in x:
                assert np.array_equal(x[k], y[k]), (mode, step, k)


def test_a_pickled_reader_maps_the_sidecar_again(tmp_path, monkeypatch):
    import pickle

    seqs = seqs_of(8, 2000)
    p = write(tmp_path / "a.pbin", seqs)
    r = PackedTokens(p)
    assert isinstance(r.doc_starts.base, np.memmap)  # mapped from the first open on
    blob = pickle.dumps(r)
    assert len(blob) < 2000 * 8  # the path of the sidecar, not 24 bytes per document

    def refuse(self):
        raise AssertionError("the index was unpickled")

    with monkeypatch.context() as m:
        m.setattr(_pickle._SafeUnpickler, "load", refuse)
        copy = pickle.loads(blob)
    assert isinstance(copy.doc_starts.base, np.memmap)
    assert contents(copy) == contents(r)
    side(p).unlink()  # gone by the time a worker starts: the index itself
    again = pickle.loads(blob)
    assert contents(again) == [s.tolist() for s in seqs]


# ---- O(1) opens: the .pbin's identity and the sidecar's seal ----------------------------------


@pytest.fixture
def digests(monkeypatch):
    """Counts how often the index is hashed."""
    calls = []
    real = sidecar.index_digest

    def counted(data, raw=None):
        calls.append(data.path)
        return real(data, raw)

    monkeypatch.setattr(sidecar, "index_digest", counted)
    return calls


def test_an_open_reads_neither_the_index_nor_the_arrays(tmp_path, monkeypatch, no_unpickling):
    seqs = seqs_of(9, 300)
    p = write(tmp_path / "a.pbin", seqs)
    PackedTokens(p)
    no_unpickling()
    from lmdata.formats.modalities.reader import PbinData

    def refuse(*a, **kw):
        raise AssertionError("read the whole index")

    monkeypatch.setattr(sidecar, "index_digest", refuse)
    monkeypatch.setattr(PbinData, "read_index_bytes", refuse)
    monkeypatch.setattr(sidecar, "_contiguous", refuse)
    r = PackedTokens(p)
    assert r.contiguous and contents(r) == [s.tolist() for s in seqs]


def test_a_touched_pbin_is_hashed_once_and_keeps_its_sidecar(tmp_path, digests, no_unpickling):
    seqs = seqs_of(10)
    p = write(tmp_path / "a.pbin", seqs)
    PackedTokens(p)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    no_unpickling()
    del digests[:]
    assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]
    assert len(digests) == 1  # the identity changed: the index decides, and it is the same
    assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]
    assert len(digests) == 1  # the new identity was recorded: no hashing on later opens


def test_changed_bytes_with_the_mtime_set_back_rebuild(tmp_path):
    # the same size and mtime, another index: the ctime (which no one sets back) tells
    p = write(tmp_path / "a.pbin", [[1, 2, 3], [4, 5], [6]])
    PackedTokens(p)
    st = os.stat(p)
    other = tmp_path / "b.pbin"
    write(other, [[1, 2], [3, 4, 5], [6]])
    raw = other.read_bytes()
    assert len(raw) == st.st_size
    with open(p, "r+b") as f:  # in place: the same inode
        f.write(raw)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(p).st_ino == st.st_ino and os.stat(p).st_mtime_ns == st.st_mtime_ns
    assert contents(PackedTokens(p)) == [[1, 2], [3, 4, 5], [6]]


def test_a_sidecar_written_to_after_it_was_built_is_rebuilt(tmp_path):
    # an in-place edit of the arrays, header intact: the sidecar's mtime is not its seal
    seqs = seqs_of(11, 5)
    p = write(tmp_path / "a.pbin", seqs)
    PackedTokens(p)
    good = side(p).read_bytes()
    n = struct.unpack_from("<Q", good, 16)[0]
    with open(side(p), "r+b") as f:
        f.seek(sidecar._HEADER.size + 8 * n)  # the first length
        f.write(struct.pack("<q", 1))
    assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]
    assert side(p).read_bytes() == good


@pytest.mark.parametrize("how", ["group-writable", "another owner"])
def test_a_sidecar_others_could_write_is_never_used(tmp_path, how, no_unpickling):
    seqs = seqs_of(12, 5)
    p = write(tmp_path / "a.pbin", seqs)
    data = PackedTokens(p).data
    # a forgery that keeps the header and the seal: only its owner could make it
    raw = bytearray(side(p).read_bytes())
    n = struct.unpack_from("<Q", raw, 16)[0]
    struct.pack_into("<q", raw, sidecar._HEADER.size + 8 * n, 1)
    seal = os.stat(side(p)).st_mtime_ns
    side(p).write_bytes(bytes(raw))
    os.utime(side(p), ns=(seal, seal))
    if how == "group-writable":
        side(p).chmod(0o664)
    elif os.geteuid() == 0:
        os.chown(side(p), 54321, -1)  # keeps the mtime: the seal still matches
    else:
        pytest.skip("only root can give a file to another user")
    assert sidecar.load(side(p), data) is None
    assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]
    cached = list((tmp_path / "cache" / sidecar.CACHE_SUBDIR).glob("*"))
    if how == "group-writable":  # replaced by one only this user can write
        assert side(p).stat().st_mode & 0o777 == 0o644 and not cached
    else:  # another user's is left alone: this user's copy goes to the private cache folder
        assert side(p).read_bytes() == bytes(raw) and len(cached) == 1
        no_unpickling()
        assert contents(PackedTokens(p)) == [s.tolist() for s in seqs]


def test_overwriting_a_pbin_drops_its_sidecar(tmp_path, monkeypatch):
    p = write(tmp_path / "a.pbin", seqs_of(13))
    PackedTokens(p)
    assert side(p).is_file()
    seen = []

    def commit_spy(self, real=lmdata.storage.LocalOutput.commit):
        seen.append(side(p).exists())
        return real(self)

    monkeypatch.setattr(lmdata.storage.LocalOutput, "commit", commit_spy)
    write(tmp_path / "a.pbin", [[7, 8]], overwrite=True)
    assert seen == [False]  # gone before the new file appears
    assert not side(p).exists()
    assert contents(PackedTokens(p)) == [[7, 8]]


def test_merging_over_a_pbin_drops_its_sidecar(tmp_path, monkeypatch):
    from lmdata.formats.modalities.merge import merge

    p = write(tmp_path / "a.pbin", seqs_of(15))
    PackedTokens(p)
    assert side(p).is_file()
    parts = [write(tmp_path / f"p{k}.pbin", [[k, k + 1]] * (k + 1)) for k in range(2)]
    seen = []

    def commit_spy(self, real=lmdata.storage.LocalOutput.commit):
        seen.append(side(p).exists())
        return real(self)

    monkeypatch.setattr(lmdata.storage.LocalOutput, "commit", commit_spy)
    merge(parts, p, overwrite=True)
    assert seen == [False, False]  # gone before the merged file (then its manifest) appears
    assert contents(PackedTokens(p)) == [[0, 1], [1, 2], [1, 2]]


def test_building_a_sidecar_reads_the_index_once(s3_root, monkeypatch):
    from lmdata.formats.modalities import reader

    seqs = seqs_of(16)
    url = write(f"{s3_root}/a.pbin", seqs)
    reads = []
    real = reader.PbinData.read_index_bytes

    def counting(self):
        reads.append(1)
        return real(self)

    monkeypatch.setattr(reader.PbinData, "read_index_bytes", counting)
    assert contents(lmdata.open(url)) == [s.tolist() for s in seqs]
    assert len(reads) == 1  # hashed and parsed from one download
    assert len(list((Path(os.environ[sidecar.CACHE_ENV]) / sidecar.CACHE_SUBDIR).iterdir())) == 1


def test_an_s3_pbin_is_known_by_its_etag(s3_root, digests, no_unpickling):
    seqs = seqs_of(14)
    url = write(f"{s3_root}/a.pbin", seqs)
    assert contents(lmdata.open(url)) == [s.tolist() for s in seqs]
    assert len(list((Path(os.environ[sidecar.CACHE_ENV]) / sidecar.CACHE_SUBDIR).iterdir())) == 1
    del digests[:]
    no_unpickling()
    assert contents(lmdata.open(url)) == [s.tolist() for s in seqs]
    assert digests == []  # the same ETag: the index is neither read nor hashed


def test_an_overwritten_s3_pbin_is_rebuilt(s3_root):
    url = write(f"{s3_root}/a.pbin", [[1, 2, 3], [4, 5], [6]])
    lmdata.open(url)
    write(url, [[1, 2], [3, 4, 5], [6]], overwrite=True)  # the same size, another index
    assert contents(lmdata.open(url)) == [[1, 2], [3, 4, 5], [6]]
