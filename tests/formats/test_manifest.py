"""Every format's writer leaves a manifest, and the fault campaign's mutations of what it wrote
are found: ``validate(deep=True)`` flags each one (bit flips, overwrites, truncation, deletion,
appended bytes, dropped lines, added files) by file name, plain ``validate`` and ``open`` every
change of a file's size or presence. Positions are drawn by hypothesis; local disk and a
loopback S3 server (moto)."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import CorruptDataError, DatasetNotFoundError
from lmdata.storage import LocalStore, _digest, join, parent, resolve
from lmdata.storage.manifest import NAME, SUFFIX, Manifest

SMALL = 1 << 16  # block size for these tests: files of several blocks stay small


def _docs(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [
        {"id": f"d{i}", "text": "word " * int(rng.integers(1, 400)), "source": "t"}
        for i in range(n)
    ]


def _tokens(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(1, 60_000, int(rng.integers(1, 900))) for _ in range(n)]


# format -> (name of the dataset, writer options, what to write, whether its data are lines)
FORMATS: dict[str, tuple[str, dict[str, Any], Callable[[], list[Any]], bool]] = {
    "flat-tokens": ("d.zarr", {"chunk_tokens": 30_000}, lambda: _tokens(300), False),
    "mds": ("d.mds", {"size_limit": 150_000}, lambda: _docs(400), False),
    "mds-jsonl": ("d.mdsj", {"size_limit": 150_000}, lambda: _docs(400), True),
    "atlas": ("d.atlas", {"shard_size": 150, "compression_strategy": 0}, lambda: _docs(400), False),
    "modalities": ("d.pbin", {"vocab_size": 60_000}, lambda: _tokens(300), False),
    "modalities-jsonl": ("d.jsonl", {}, lambda: _docs(400), True),
    "jsonl": ("d.jsonl", {}, lambda: _docs(400), True),
    "dolma": ("d.dolma", {"max_file_docs": 150}, lambda: _docs(400), True),
}


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(_digest, "BLOCK", SMALL)


class Written:
    """A dataset lmdata wrote, its manifest, and a way to change a file and put it back."""

    def __init__(self, fmt: str, root: str) -> None:
        name, opts, make, self.lines = FORMATS[fmt]
        self.fmt = fmt
        self.path = f"{root}/{name}"
        with lmdata.writer(self.path, fmt, **opts) as w:
            for x in make():
                w.write(x)
        self.store, self.key = resolve(self.path)
        self.directory = self.store.is_dir(self.key)
        mkey = join(self.key, NAME) if self.directory else self.key + SUFFIX
        self.manifest = Manifest.parse(self.store.read(mkey), mkey)
        self.folder = self.key if self.directory else parent(self.key)
        self.files = sorted(e.name for e in self.manifest.files)

    def url(self, name: str) -> str:
        return self.store.url(join(self.folder, name))

    def read(self, name: str) -> bytes:
        # a store of its own: a store remembers the files it read and refuses one replaced
        return resolve(self.path)[0].read(join(self.folder, name))

    def put(self, name: str, data: bytes) -> None:
        key = join(self.folder, name)
        if isinstance(self.store, LocalStore):
            os.makedirs(os.path.dirname(key), exist_ok=True)
            with open(key, "wb") as f:
                f.write(data)
        else:
            self.store.put(key, data)

    def remove(self, name: str) -> None:
        self.store.remove(join(self.folder, name))


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path):
    """Local disk, or a fresh prefix on the loopback S3 server."""
    if request.param == "s3":
        return request.getfixturevalue("s3_root")
    return str(tmp_path)


@pytest.fixture(params=sorted(FORMATS))
def written(request, place, small_blocks):
    return Written(request.param, place)


def _flagged(problems: list[str], w: Written, name: str) -> bool:
    return any(p.startswith(w.url(name) + ":") for p in problems)


EXAMPLES = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_every_writer_leaves_a_manifest_that_validates(written):
    w = written
    assert w.files and w.manifest.format == w.fmt
    assert w.manifest.records == 400 or w.manifest.records == 300
    sizes = {e.name: e.size for e in w.manifest.files}
    if w.fmt != "dolma":  # (its gzip files stay small)
        assert any(s > SMALL for s in sizes.values()), "a file of several blocks"
    assert lmdata.validate(w.path, deep=True) == []
    assert lmdata.info(w.path)["manifest"]["files"] == len(w.files)
    lmdata.open(w.path).close()


@given(data=st.data())
@EXAMPLES
def test_flipped_bits_and_overwrites_are_found_by_deep_validate(written, data):
    w = written
    name = data.draw(st.sampled_from(w.files), label="file")
    old = w.read(name)
    if not old:
        return
    start = data.draw(st.integers(0, len(old) - 1), label="start")
    length = data.draw(st.integers(1, min(64, len(old) - start)), label="length")
    mask = data.draw(st.binary(min_size=length, max_size=length), label="mask")
    mask = bytes(m or 1 << (i % 8) for i, m in enumerate(mask))  # every byte changes
    new = bytearray(old)
    new[start : start + length] = bytes(a ^ b for a, b in zip(old[start:], mask, strict=False))
    w.put(name, bytes(new))
    try:
        problems = lmdata.validate(w.path, deep=True)
        assert _flagged(problems, w, name), (name, start, problems)
        block = start // SMALL
        assert any(f"bytes {block * SMALL:,}-" in p for p in problems if w.url(name) in p)
    finally:
        w.put(name, old)


@given(data=st.data())
@EXAMPLES
def test_truncated_grown_and_deleted_files_are_found_by_a_listing(written, data):
    w = written
    name = data.draw(st.sampled_from(w.files), label="file")
    how = data.draw(st.sampled_from(["truncate", "append", "delete"]), label="how")
    old = w.read(name)
    if how == "truncate":
        if not old:
            return
        w.put(name, old[: data.draw(st.integers(0, len(old) - 1), label="length")])
    elif how == "append":
        w.put(name, old + data.draw(st.binary(min_size=1, max_size=100), label="tail"))
    else:
        w.remove(name)
    try:
        if how == "delete" and w.url(name) == w.store.url(w.key):  # the path given is gone
            with pytest.raises(DatasetNotFoundError):
                lmdata.validate(w.path)
            return
        assert _flagged(lmdata.validate(w.path), w, name)
        with pytest.raises(CorruptDataError) as e:
            lmdata.open(w.path)
        assert w.url(name) in str(e.value)
    finally:
        w.put(name, old)


@given(data=st.data())
@EXAMPLES
def test_dropped_lines_are_found(written, data):
    w = written
    if not w.lines:
        return
    names = [n for n in w.files if n.endswith((".jsonl", ".jsonl.gz", ".json.gz")) or "shard" in n]
    names = [n for n in names if not n.endswith((".meta", ".idx"))]
    name = data.draw(st.sampled_from(names), label="file")
    old = w.read(name)
    zipped = name.endswith(".gz")
    lines = (gzip.decompress(old) if zipped else old).splitlines(keepends=True)
    drop = data.draw(st.integers(0, len(lines) - 1), label="line")
    kept = b"".join(lines[:drop] + lines[drop + 1 :])
    new = gzip.compress(kept, mtime=0) if zipped else kept
    w.put(name, new)
    try:
        problems = lmdata.validate(w.path, deep=True)
        assert _flagged(problems, w, name)
        if len(new) != len(old):
            assert _flagged(lmdata.validate(w.path), w, name)
    finally:
        w.put(name, old)


def test_an_added_file_is_flagged_and_verify_false_reads_anyway(written):
    w = written
    if not w.directory:
        pytest.skip("a one-file dataset has no folder to add to")
    extra = join(parent(w.files[-1]), "stray.bin") if "/" in w.files[-1] else "stray.bin"
    w.put(extra, b"stray bytes")
    try:
        assert _flagged(lmdata.validate(w.path), w, extra)
        with pytest.raises(CorruptDataError, match="verify=False"):
            lmdata.open(w.path)
        with lmdata.open(w.path, verify=False) as r:
            assert len(r) in (300, 400)
    finally:
        w.remove(extra)
    lmdata.open(w.path).close()


def test_a_new_folder_beside_the_listed_ones_is_no_change(tmp_path, small_blocks):
    """A Dolma tree gains attribute folders after it is written (tag, dedupe): folders the
    manifest lists nothing in are not checked for added files."""
    w = Written("dolma", str(tmp_path))
    w.put("attributes/exp/part.jsonl.gz", gzip.compress(b'{"id": "d0", "attributes": {}}\n'))
    problems = lmdata.validate(w.path, deep=True)  # (the dolma format finds this file odd)
    assert not [p for p in problems if "manifest" in p or "differ from what" in p], problems
    lmdata.open(w.path).close()


# ---- origin tools, compat writers, and what carries a manifest over ------------------------


def test_the_origins_read_path_ignores_the_manifest_atlas(tmp_path):
    from tests.formats.test_atlas_compat import origin_read

    docs = _docs(50)
    with lmdata.writer(tmp_path / "a", "atlas", shard_size=20, block_size=4) as w:
        for d in docs:
            w.write(d)
    assert (tmp_path / "a" / NAME).is_file()
    assert origin_read(tmp_path / "a") == docs  # every folder a shard: a file is skipped


def test_compat_writers_leave_the_origins_file_set(tmp_path):
    from lmdata.compat import atlas as catlas
    from lmdata.compat import seqax
    from lmdata.compat.streaming import MDSWriter

    with MDSWriter(out=str(tmp_path / "s"), columns={"a": "int"}) as w:
        w.write({"a": 1})
    with MDSWriter(out=str(tmp_path / "s2"), columns={"a": "int"}, lmdata_manifest=True) as w:
        w.write({"a": 1})
    with catlas.AtlasDatasetWriter(tmp_path / "a", 10, 2) as w:
        w.add_example({"x": 1})
    with catlas.AtlasDatasetWriter(tmp_path / "a2", 10, 2, lmdata_manifest=True) as w:
        w.add_example({"x": 1})
    cfg = seqax.Config(tokens_chunk_size=64, seq_starts_chunk_size=16)
    with seqax.Writer(str(tmp_path / "z"), seqax.Split.TRAIN, "w", cfg) as w:
        w.write(seqax.Chunk.from_ragged([np.array([1, 2, 3], np.uint32)]))
    assert not (tmp_path / "s" / NAME).exists() and (tmp_path / "s2" / NAME).is_file()
    assert not (tmp_path / "a" / NAME).exists() and (tmp_path / "a2" / NAME).is_file()
    assert not (tmp_path / "z" / NAME).exists()
    assert lmdata.validate(tmp_path / "s2", deep=True) == []
    assert lmdata.validate(tmp_path / "a2", deep=True) == []


def test_a_seqax_append_keeps_lmdata_s_manifest_right(tmp_path):
    from lmdata.compat import seqax

    p = tmp_path / "d.zarr"
    with lmdata.writer(p, "flat-tokens", chunk_tokens=64, compression="blosc") as w:
        for s in _tokens(20):
            w.write(s % 1000)
    before = Manifest.parse((p / NAME).read_bytes(), "m")
    cfg = seqax.Config(tokens_chunk_size=64, seq_starts_chunk_size=16)
    with seqax.Writer(str(p), seqax.Split.TRAIN, "a", cfg) as w:
        w.write(seqax.Chunk.from_ragged([np.arange(1, 200, dtype=np.uint32)] * 3))
    after = Manifest.parse((p / NAME).read_bytes(), "m")
    assert len(after.files) > len(before.files)
    kept = set(before.files) & set(after.files)  # the files the append left alone keep theirs
    assert kept and lmdata.validate(p, deep=True) == []
    assert len(lmdata.open(p)) == 23


def test_a_failed_seqax_append_leaves_a_manifest_of_what_remains(tmp_path):
    from lmdata.compat import seqax

    p = tmp_path / "d.zarr"
    with lmdata.writer(p, "flat-tokens", chunk_tokens=64, compression="blosc") as w:
        w.write([1, 2, 3])
    cfg = seqax.Config(tokens_chunk_size=64, seq_starts_chunk_size=16)
    with pytest.raises(RuntimeError), seqax.Writer(str(p), seqax.Split.TRAIN, "a", cfg) as w:
        w.write(seqax.Chunk.from_ragged([np.arange(1, 500, dtype=np.uint32)]))
        raise RuntimeError("boom")
    assert (p / NAME).is_file()
    assert lmdata.validate(p, deep=True) == []
    assert [s.tolist() for s in lmdata.open(p)] == [[1, 2, 3]]


def _flip(path, at: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_merges_carry_the_inputs_hashes_over(tmp_path):
    """A merge keeps what the inputs' writers wrote: an input damaged before the merge (same
    size) is still found in the merged dataset, where hashing anew would bless it."""
    from lmdata._api import merge

    docs = _docs(60)
    for k in range(2):
        with lmdata.writer(tmp_path / f"a{k}", "atlas", shard_size=20, compression_strategy=1) as w:
            for d in docs:
                w.write(d)
        with lmdata.writer(tmp_path / "m" / str(k), "mds", size_limit=4000) as w:
            for d in docs:
                w.write(d)
    _flip(tmp_path / "a1" / "1" / "data.bin", 7)
    _flip(sorted((tmp_path / "m" / "1").glob("shard.*"))[1], 9)
    merge([str(tmp_path / "a0"), str(tmp_path / "a1")], str(tmp_path / "am"))
    merge([str(tmp_path / "m")], str(tmp_path / "m"))
    got = lmdata.validate(tmp_path / "am", deep=True)
    assert [p.split(": ")[0] for p in got if "differ" in p] == [str(tmp_path / "am" / "4/data.bin")]
    got = lmdata.validate(tmp_path / "m", deep=True)
    assert any("1/shard.00001.mds: bytes" in p for p in got), got


def test_an_atlas_append_carries_the_old_hashes_and_hashes_the_new(tmp_path):
    p = tmp_path / "a"
    with lmdata.writer(p, "atlas", shard_size=20, compression_strategy=1) as w:
        for d in _docs(50):
            w.write(d)
    _flip(p / "0" / "data.bin", 3)
    with lmdata.writer(p, "atlas", append=True) as w:
        for d in _docs(30):
            w.write(d)
    got = lmdata.validate(p, deep=True)
    assert [x.split(": ")[0] for x in got if "differ" in x] == [str(p / "0" / "data.bin")]
    assert lmdata.info(p)["manifest"]["records"] == 80


def test_convert_and_tokenize_write_manifests(where):
    from lmdata.convert import convert

    src = f"{where}-src.jsonl"
    with lmdata.writer(src, "jsonl") as w:
        for d in _docs(30):
            w.write(d)
    convert(src, f"{where}-mds", "mds", workers=0)
    lmdata.tokenize(src, f"{where}-tok", format="flat-tokens", workers=0)
    for out in (f"{where}-mds", f"{where}-tok"):
        made = lmdata.info(out)["manifest"]
        assert isinstance(made, dict) and made["files"] > 1
        assert lmdata.validate(out, deep=True) == []


def test_overwriting_a_one_file_dataset_replaces_its_manifest(where):
    path = f"{where}.pbin"
    for n in (5, 9):
        with lmdata.writer(path, "modalities", overwrite=True, vocab_size=100) as w:
            for _ in range(n):
                w.write([1, 2, 3])
        assert lmdata.info(path)["manifest"]["records"] == n
        assert lmdata.validate(path, deep=True) == []


def test_an_atlas_append_on_s3_keeps_the_manifest_right(s3_root):
    url = f"{s3_root}/a"
    with lmdata.writer(url, "atlas", shard_size=20, compression_strategy=1) as w:
        for d in _docs(50):
            w.write(d)
    with lmdata.writer(url, "atlas", append=True) as w:
        for d in _docs(30):
            w.write(d)
    assert lmdata.info(url)["manifest"]["records"] == 80
    assert lmdata.validate(url, deep=True) == []
    assert len(lmdata.open(url)) == 80
