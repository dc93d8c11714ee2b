"""The manifest's storage layer: hashing while writing, the file's layout and its parsing
(hostile ones included), the output that writes it, and the checks against it."""

from __future__ import annotations

import io
import itertools
import json
import os

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.errors import CorruptDataError, LmdataError
from lmdata.storage import LocalStore, _digest, join, manifest_output
from lmdata.storage._digest import BlockHasher, combine, hash_bytes, hash_file, hashing_file
from lmdata.storage.manifest import NAME, SUFFIX, FileEntry, Manifest
from lmdata.storage.manifest_check import (
    compare,
    create,
    deep_problems,
    find,
    hash_blocks,
    listing_problems,
    verify,
)

SMALL = 1 << 16  # the smallest block a manifest may have: files of several blocks stay small


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(_digest, "BLOCK", SMALL)
    return SMALL


def reference(data: bytes, block: int) -> tuple[str, tuple[str, ...]]:
    """The manifest's hashes of ``data`` computed the plain way."""
    blocks = [xxhash.xxh3_128_digest(data[i : i + block]) for i in range(0, len(data), block)]
    if len(blocks) <= 1:
        return xxhash.xxh3_128_hexdigest(data), ()
    return combine(blocks).hex(), tuple(b.hex() for b in blocks)


# ---- hashing ---------------------------------------------------------------------------------


@given(
    data=st.binary(max_size=5 * SMALL + 100),
    cuts=st.lists(st.integers(0, 5 * SMALL + 100), max_size=8),
)
@settings(max_examples=60, deadline=None)
def test_block_hasher_matches_the_plain_computation(data, cuts):
    h = BlockHasher(SMALL)
    pos = 0
    for c in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        h.update(data[pos:c])
        pos = c
    d = h.finish()
    assert (d.hash, d.blocks) == reference(data, SMALL)
    assert d.size == len(data)
    assert hash_bytes(data, SMALL) == d


# a sequence of operations on a file being written: ("w", n) writes n fresh bytes,
# ("s", k) seeks to position k (clamped into the file), ("t", n) truncates the file to n
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("w"), st.integers(1, 3 * SMALL)),
        st.tuples(st.just("s"), st.integers(0, 4 * SMALL)),
        st.tuples(st.just("t"), st.integers(0, 5 * SMALL)),
    ),
    max_size=10,
)


@given(ops=_OPS)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_hashing_file_follows_seeks_patches_and_holes(tmp_path, ops):
    """Whatever a writer does to its file (patch a header, leave a hole, cut it short), the
    digest given at close is that of the bytes the file holds."""
    path = str(tmp_path / "f.bin")
    got = []
    f = hashing_file(open(path, "wb"), got.append, block=SMALL)
    rng = 0
    for op, n in ops:
        if op == "w":
            rng += 1
            f.write(bytes([rng % 256]) * (n // 2) + os.urandom(n - n // 2))
        elif op == "s":
            f.seek(n)
        else:
            f.truncate(n)
    f.close()
    want = hash_file(path, SMALL)
    assert got == [want]
    assert (want.hash, want.blocks) == reference(open(path, "rb").read(), SMALL)


def test_a_file_without_a_path_is_written_in_order_only(tmp_path):
    class Sink(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            return len(b)

    got = []
    f = hashing_file(Sink(), got.append, block=SMALL)
    f.write(b"abc")
    with pytest.raises(io.UnsupportedOperation):
        f.seek(0)
    f.write(b"def")
    f.close()
    assert got[0].hash == xxhash.xxh3_128_hexdigest(b"abcdef")


# ---- the file and its parsing ----------------------------------------------------------------


@given(
    sizes=st.lists(st.integers(0, 10 * SMALL), min_size=1, max_size=6),
    records=st.one_of(st.none(), st.integers(0, 1 << 40)),
)
@settings(max_examples=40, deadline=None)
def test_manifest_round_trip(sizes, records):
    entries = []
    for i, n in enumerate(sizes):
        data = bytes([i]) * n
        entries.append(FileEntry.of(f"d{i}/f{i}.bin", hash_bytes(data, SMALL), i or None))
    m = Manifest(tuple(entries), SMALL, made_by="lmdata test", format="mds", records=records)
    back = Manifest.parse(m.to_bytes(), "x")
    assert back == Manifest(
        tuple(sorted(entries, key=lambda e: e.name)), SMALL, m.made_by, "mds", records
    )
    assert m.to_bytes().count(b"\n") == len(entries) + 2  # a head, one line per file, an end


def _good() -> dict:
    data = bytes(range(200)) * 1000  # 200,000 bytes: 4 blocks of 64 KiB
    d = hash_bytes(data, SMALL)
    m = Manifest((FileEntry.of("a/b.bin", d), FileEntry.of("c", hash_bytes(b"x"))), SMALL)
    return json.loads(m.to_bytes())


def _with(change) -> bytes:
    obj = _good()
    change(obj)
    return json.dumps(obj).encode()


HOSTILE = {
    "not json": b"{nope",
    "a list": b"[]",
    "no version": _with(lambda o: o.pop("lmdata_manifest")),
    "another hash": _with(lambda o: o.update(hash="md5")),
    "block not a power of two": _with(lambda o: o.update(block_bytes=100_000)),
    "block too small": _with(lambda o: o.update(block_bytes=1024)),
    "block a bool": _with(lambda o: o.update(block_bytes=True)),
    "files not a list": _with(lambda o: o.update(files={"a": 1})),
    "entry not an object": _with(lambda o: o["files"].append(3)),
    "absolute name": _with(lambda o: o["files"][1].update(name="/etc/passwd")),
    "name leaving the folder": _with(lambda o: o["files"][1].update(name="../x")),
    "name with an empty part": _with(lambda o: o["files"][1].update(name="a//x")),
    "backslash name": _with(lambda o: o["files"][1].update(name="a\\x")),
    "empty name": _with(lambda o: o["files"][1].update(name="")),
    "duplicate name": _with(lambda o: o["files"][1].update(name="a/b.bin")),
    "negative size": _with(lambda o: o["files"][1].update(bytes=-1)),
    "size a bool": _with(lambda o: o["files"][1].update(bytes=True)),
    "size a float": _with(lambda o: o["files"][1].update(bytes=1.0)),
    "short hash": _with(lambda o: o["files"][1].update(xxh3_128="abc")),
    "upper-case hash": _with(lambda o: o["files"][1].update(xxh3_128="A" * 32)),
    "missing blocks": _with(lambda o: o["files"][0].pop("blocks")),
    "a block too many": _with(lambda o: o["files"][0]["blocks"].append("0" * 32)),
    "blocks on a small file": _with(lambda o: o["files"][1].update(blocks=["0" * 32])),
    "bad records": _with(lambda o: o["files"][1].update(records=-5)),
    "deep nesting": b'{"lmdata_manifest":1,"x":' + b"[" * 100 + b"]" * 100 + b"}",
    "a string made_by too long": _with(lambda o: o.update(made_by="x" * 10_000)),
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_hostile_manifests_are_clear_errors(what):
    with pytest.raises(CorruptDataError) as e:
        Manifest.parse(HOSTILE[what], "/data/ds/lmdata-manifest")
    assert "/data/ds/lmdata-manifest" in str(e.value)


def test_a_newer_manifest_says_to_upgrade():
    data = _with(lambda o: o.update(lmdata_manifest=7))
    with pytest.raises(LmdataError, match="newer lmdata"):
        Manifest.parse(data, "m")


def test_an_oversized_manifest_is_refused_before_parsing(tmp_path, monkeypatch):
    from lmdata.storage import manifest

    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 1000)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / NAME).write_bytes(b" " * 5000)
    with pytest.raises(LmdataError, match="larger than"):
        find(LocalStore(), str(tmp_path / "ds"))


# ---- writing it --------------------------------------------------------------------------------


def _read_manifest(store, key):
    return Manifest.parse(store.read(key), key)


def test_output_lists_every_object_with_its_hashes(store_root, small_blocks):
    store, root = store_root
    big = os.urandom(3 * SMALL + 17)
    key = join(root, "ds")
    out = manifest_output(store, key, directory=True, overwrite=False, format="test")
    out.write("a/one.bin", big)
    with out.open_write("b/two.bin") as f:
        for i in range(0, len(big), 1000):
            f.write(big[i : i + 1000])
    out.count(7, "b/two.bin")
    out.count(3, "a/one.bin")
    out.write_last("meta.json", b"{}")
    out.commit()
    m = _read_manifest(store, join(key, NAME))
    got = {e.name: e for e in m.files}
    assert sorted(got) == ["a/one.bin", "b/two.bin", "meta.json"]
    assert (got["a/one.bin"].hash, got["a/one.bin"].blocks) == reference(big, SMALL)
    assert (got["b/two.bin"].hash, got["b/two.bin"].blocks) == reference(big, SMALL)
    assert got["b/two.bin"].records == 7 and m.records == 10 and m.format == "test"
    assert listing_problems(store, find(store, key)) == []
    assert deep_problems(store, find(store, key)) == []


def test_output_without_manifest_writes_none(store_root):
    store, root = store_root
    key = join(root, "ds")
    out = manifest_output(store, key, directory=True, overwrite=False, manifest=False)
    out.write("a.bin", b"abc")
    out.commit()
    assert store.list(key) == ["a.bin"]
    assert find(store, key) is None


def test_aborted_output_leaves_no_manifest(store_root):
    store, root = store_root
    key = join(root, "ds")
    out = manifest_output(store, key, directory=True, overwrite=False)
    out.write("a.bin", b"abc")
    out.abort()
    assert not store.exists(join(key, NAME))


def test_one_object_gets_its_manifest_beside_it_and_a_replacement_a_new_one(store_root):
    store, root = store_root
    key = join(root, "f.bin")
    for data in (b"first" * 100, b"second!"):
        out = manifest_output(store, key, directory=False, overwrite=True)
        with out.open_write("") as f:
            f.write(data)
        out.commit()
        m = _read_manifest(store, key + SUFFIX)
        assert [(e.name, e.size, e.hash) for e in m.files] == [
            ("f.bin", len(data), xxhash.xxh3_128_hexdigest(data))
        ]
        verify(store, key)


# ---- checking against it ---------------------------------------------------------------------


def _dataset(store, key, files):
    out = manifest_output(store, key, directory=True, overwrite=False)
    for name, data in files.items():
        out.write(name, data)
    out.commit()


def test_listing_finds_deleted_added_truncated_and_grown_files(store_root):
    store, root = store_root
    key = join(root, "ds")
    _dataset(store, key, {"a": b"aaaa", "b": b"bbbb", "sub/c": b"cccc", "d": b"dd"})
    assert verify(store, key) is not None
    store.remove(join(key, "a"))
    _put(store, join(key, "b"), b"bb")
    _put(store, join(key, "sub/c"), b"ccccc")
    _put(store, join(key, "sub/new"), b"!")
    _put(store, join(key, "newdir/attr"), b"?")  # a folder the manifest lists nothing in
    found = find(store, key)
    kinds = {(p.name, p.kind) for p in listing_problems(store, found)}
    assert kinds == {("a", "deleted"), ("b", "truncated"), ("sub/c", "grown"), ("sub/new", "added")}
    with pytest.raises(CorruptDataError) as e:
        verify(store, key)
    assert store.url(join(key, "a")) in str(e.value) and "verify=False" in str(e.value)


def _put(store, key, data):
    if isinstance(store, LocalStore):
        os.makedirs(os.path.dirname(key), exist_ok=True)
        with open(key, "wb") as f:
            f.write(data)
    else:
        store.put(key, data)


def test_deep_check_names_the_first_block_that_differs(store_root, small_blocks):
    store, root = store_root
    key = join(root, "ds")
    data = os.urandom(4 * SMALL)
    _dataset(store, key, {"x.bin": data, "y.bin": b"small"})
    changed = bytearray(data)
    changed[2 * SMALL + 5] ^= 1
    changed[3 * SMALL + 9] ^= 0x80
    _put(store, join(key, "x.bin"), bytes(changed))
    found = find(store, key)
    assert listing_problems(store, found) == []
    (p,) = deep_problems(store, found, workers=3)
    assert p.name == "x.bin" and p.kind == "changed"
    assert f"bytes {2 * SMALL:,}-{3 * SMALL - 1:,} (block 2)" in p.detail
    assert "2 of its 4 blocks" in p.detail


def test_edited_block_list_is_caught(tmp_path, small_blocks):
    store = LocalStore()
    key = str(tmp_path / "ds")
    data = os.urandom(2 * SMALL)
    _dataset(store, key, {"x.bin": data})
    mkey = join(key, NAME)
    obj = json.loads(store.read(mkey))
    obj["files"][0]["blocks"][0] = "0" * 32
    with open(mkey, "w") as f:
        json.dump(obj, f)
    store = LocalStore()  # a new store: one remembers the files it read, and this one changed
    kinds = {p.kind for p in deep_problems(store, find(store, key))}
    assert kinds == {"manifest", "changed"}


def test_hash_blocks_reports_progress_and_equals_one_thread(tmp_path):
    store = LocalStore()
    files = []
    for i in range(5):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(i * SMALL + 3))
        files.append((str(p), p.stat().st_size))
    seen = []
    record = lambda e: seen.append((e.done, e.total))  # noqa: E731
    many = dict(hash_blocks(store, files, SMALL, record, workers=4))
    one = dict(hash_blocks(store, files, SMALL, workers=1))
    assert many == one
    total = sum(s for _, s in files)
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(seen))


def test_a_file_changed_while_hashed_is_a_clear_error(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    with pytest.raises(CorruptDataError, match="changed while it was checked"):
        dict(hash_blocks(LocalStore(), [(str(p), 10)], SMALL))


def test_create_carries_entries_and_hashes_the_rest(tmp_path):
    store = LocalStore()
    key = str(tmp_path / "ds")
    os.makedirs(join(key, "p"))
    for name, data in {"p/a": b"aaa", "p/b": b"bbb", "index.json": b"{}"}.items():
        with open(join(key, name), "wb") as f:
            f.write(data)
    fake = FileEntry("p/a", 3, "f" * 32)  # what the partition's writer wrote (carried as is)
    m = create(store, key, directory=True, carried={"p/a": fake}, records=6)
    got = m.entries()
    assert got["p/a"] == fake and got["p/b"].hash == xxhash.xxh3_128_hexdigest(b"bbb")
    assert m.records == 6 and find(store, key).manifest.entries() == got


def test_compare_of_one_file_dataset_ignores_other_files(tmp_path):
    store = LocalStore()
    key = str(tmp_path / "f.jsonl")
    out = manifest_output(store, key, directory=False, overwrite=False)
    out.write("", b'{"a":1}\n')
    out.commit()
    with open(tmp_path / "other.txt", "w") as f:
        f.write("unrelated")
    found = find(store, key)
    assert not found.directory
    assert compare(found, {"f.jsonl": 8}) == []
    assert listing_problems(store, found) == []
