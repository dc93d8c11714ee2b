"""Hostile and damaged input for every format: each must end in an lmdata.errors exception that
names the file (or a validate problem that does), never a raw traceback, a hang or an
unbounded allocation.

A valid dataset of each format is written once; hypothesis then truncates files, flips bits
and empties files, and reading, iterating and validating the result may only raise
``LmdataError``.
"""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata._report import overflow_line
from lmdata.errors import CorruptDataError, FormatError, LmdataError

DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
# a pickle of lists nested 100,000 deep: loading it never recurses, its repr would
DEEP_PICKLE = b"\x80\x04" + b"]" * 100_000 + b"a" * 99_999 + b"."

RECORDS = [{"id": f"d{i}", "text": "word " * (i % 13), "n": i} for i in range(60)]
SEQS = [list(range(1, 2 + i % 9)) for i in range(60)]


# ---- one small valid dataset per format --------------------------------------------------------


def _flat_tokens(p: Path) -> Path:
    with lmdata.writer(p, "flat-tokens", manifest=False, chunk_tokens=64, compression="zstd") as w:
        for s in SEQS:
            w.write(s)
        w.write([1, 2], split="validation")
    return p


def _atlas(p: Path) -> Path:
    with lmdata.writer(  # no manifest: these tests exercise the readers' own checks
        p, "atlas", shard_size=30, block_size=4, compression_strategy=2, compression_level=3
    ) as w:
        for r in RECORDS:
            w.write(r)
    return p


def _pbin(p: Path) -> Path:
    with lmdata.writer(p, "modalities", manifest=False, token_width=2) as w:
        for s in SEQS:
            w.write(np.array(s, np.uint16))
    return p


def _jsonl_idx(p: Path) -> Path:
    with lmdata.writer(p, "modalities-jsonl", manifest=False) as w:
        for r in RECORDS:
            w.write(r)
    return p


def _mds(p: Path) -> Path:
    cols = {"id": "str", "text": "str", "n": "int64"}
    with lmdata.writer(
        p, "mds", manifest=False, columns=cols, compression="zstd", size_limit=1 << 10
    ) as w:
        for r in RECORDS:
            w.write(r)
    return p


def _dolma(p: Path) -> Path:
    with lmdata.writer(p, "dolma", manifest=False, max_file_docs=25) as w:
        for r in RECORDS:
            w.write({"id": r["id"], "text": r["text"], "source": "s"})
    return p


BUILDERS = {
    "flat-tokens": ("d.zarr", _flat_tokens),
    "atlas": ("d.atlas", _atlas),
    "modalities": ("d.pbin", _pbin),
    "modalities-jsonl": ("d.jsonl", _jsonl_idx),
    "mds": ("d.mds", _mds),
    "dolma": ("d.dolma", _dolma),
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("valid")
    out = {}
    for fmt, (name, build) in BUILDERS.items():
        out[fmt] = build(base / fmt / name)
        assert lmdata.validate(out[fmt], format=fmt) == [], fmt
    return out


def _files(root: Path) -> list[Path]:
    """The dataset's files (the .idx beside a .jsonl included), sorted."""
    if root.is_file():
        return sorted(f for f in root.parent.iterdir() if f.is_file())
    return sorted(f for f in root.rglob("*") if f.is_file())


def _exercise(root: Path, fmt: str) -> list[str]:
    """Open, read everything, validate: what an lmdata user does. Returns validate's problems
    and lets LmdataError through."""
    r = lmdata.open(root, format=fmt)
    n = len(r)
    for i in range(n):
        r[i]
    list(r)
    return lmdata.validate(root, format=fmt)


def _base(root: Path) -> Path:
    """The folder of a dataset (a one-file dataset's: its index lives beside it)."""
    return root.parent if root.is_file() else root


def _names_the_dataset(message: str, root: Path) -> bool:
    return str(_base(root)) in message


# ---- mutations found by hypothesis ---------------------------------------------------------


@pytest.mark.parametrize("fmt", list(BUILDERS))
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_damaged_files_end_in_lmdata_errors(datasets, tmp_path_factory, fmt, data):
    src = datasets[fmt]
    work = tmp_path_factory.mktemp("damaged")
    root = work / src.name
    if src.is_dir():
        shutil.copytree(src, root)
    else:
        for f in src.parent.iterdir():
            shutil.copy(f, work / f.name)
    files = _files(root)
    victim = data.draw(st.sampled_from(files), label="file")
    raw = victim.read_bytes()
    how = data.draw(
        st.sampled_from(["truncate", "flip", "huge", "empty", "garbage"]), label="damage"
    )
    if how == "truncate" and raw:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="keep")]
    elif how == "flip" and raw:
        pos = data.draw(st.integers(0, len(raw) - 1), label="byte")
        bit = data.draw(st.integers(0, 7), label="bit")
        raw = raw[:pos] + bytes([raw[pos] ^ (1 << bit)]) + raw[pos + 1 :]
    elif how == "huge" and len(raw) >= 8:  # a length or offset field made enormous
        pos = data.draw(st.integers(0, len(raw) - 8), label="at")
        value = data.draw(st.sampled_from([2**31 - 1, 2**32 + 7, 2**62, 2**64 - 1]))
        raw = raw[:pos] + value.to_bytes(8, "little") + raw[pos + 8 :]
    elif how == "empty":
        raw = b""
    else:
        raw = data.draw(st.binary(max_size=64), label="garbage")
    victim.write_bytes(raw)
    try:
        problems = _exercise(root, fmt)
    except LmdataError as e:  # the error names the dataset, or a file inside it
        inside = e.path is not None and e.path.startswith(str(_base(root)))
        assert inside or _names_the_dataset(str(e), root), str(e)
        return
    # files and folders by name or path in the dataset (not chunk "0": it would match anything)
    base = _base(root)
    named = {f.name for f in files} | {str(f.parent.relative_to(base)) for f in files}
    named = {n for n in named if not n.isdigit() and n != "."}
    for m in problems:  # each problem names the dataset or one of its files
        if m.endswith(overflow_line("", 0).split("0", 1)[1]):
            continue  # "kind: N more problems like the above" names what it counts
        assert _names_the_dataset(m, root) or any(n in m for n in named), m


# ---- deeply nested metadata -----------------------------------------------------------------


META_FILES = [
    ("flat-tokens", "train/.zattrs"),
    ("flat-tokens", "train/encoded_tokens/.zarray"),
    ("flat-tokens", "train/seq_starts/.zarray"),
    ("atlas", "meta.json"),
    ("atlas", "0/meta.json"),
    ("mds", "index.json"),
]


@pytest.mark.parametrize("fmt, name", META_FILES)
def test_deeply_nested_json_metadata(datasets, tmp_path, fmt, name):
    root = tmp_path / datasets[fmt].name
    shutil.copytree(datasets[fmt], root)
    target = root / name
    assert target.is_file(), name
    target.write_bytes(DEEP_JSON)
    with pytest.raises(LmdataError) as ei:
        lmdata.open(root, format=fmt)
    assert str(target) in str(ei.value) or str(root) in str(ei.value)
    problems = lmdata.validate(root, format=fmt)
    assert problems and any(str(root) in m or name in m for m in problems), problems
    try:
        lmdata.detect(root)  # may find no format, but never a RecursionError
    except FormatError:
        pass


def test_deeply_nested_zarr_v3_metadata(tmp_path):
    zarr = pytest.importorskip("zarr")
    g = zarr.open_group(str(tmp_path / "z.zarr"), mode="w", zarr_format=3)
    s = g.create_group("train")
    s.create_array("encoded_tokens", shape=(2,), chunks=(2,), dtype="uint32")[:] = [3, 4]
    s.create_array("seq_starts", shape=(2,), chunks=(2,), dtype="uint64")[:] = [0, 2]
    s.attrs["max_token_id"] = 2
    assert [x.tolist() for x in lmdata.open(tmp_path / "z.zarr")] == [[1, 2]]
    for node in ("train", "train/encoded_tokens"):
        f = tmp_path / "z.zarr" / node / "zarr.json"
        good = f.read_bytes()
        f.write_bytes(DEEP_JSON)
        with pytest.raises(LmdataError, match=r"zarr\.json"):
            lmdata.open(tmp_path / "z.zarr", format="flat-tokens")
        assert lmdata.validate(tmp_path / "z.zarr", format="flat-tokens")
        try:
            lmdata.detect(tmp_path / "z.zarr")  # names only, or no format: never RecursionError
        except FormatError:
            pass
        f.write_bytes(good)


def test_deeply_nested_atlas_meta_is_not_detected(datasets, tmp_path):
    root = tmp_path / "a"
    shutil.copytree(datasets["atlas"], root)
    (root / "meta.json").write_bytes(DEEP_JSON)
    with pytest.raises(FormatError, match="cannot tell the format"):
        lmdata.detect(root)


def test_json_loader_limits():
    from lmdata import _json

    assert _json.parse(b'{"a": "[[[[[[[[", "b": [[1]]}') == {"a": "[[[[[[[[", "b": [[1]]}
    assert _json.parse(b'{"big": 123456789012345678901234567890}')["big"] == 10**29 + (
        23456789012345678901234567890
    )
    assert _json.nesting_depth(b'["\\\\", ["\\"[["]]') == 2
    with pytest.raises(ValueError, match="nested"):
        _json.parse(DEEP_JSON)
    with pytest.raises(ValueError, match="nested 65 levels"):
        _json.parse(b"[" * 65 + b"]" * 65, max_depth=64)


def test_metadata_size_is_bounded(datasets, tmp_path):
    root = tmp_path / "m"
    shutil.copytree(datasets["mds"], root)
    with open(root / "index.json", "r+b") as f:
        f.truncate((1 << 30) + 1)  # sparse: 1 GiB of zeros, never read whole
    with pytest.raises(LmdataError, match="larger than"):
        lmdata.open(root, format="mds")


# ---- pickled indexes --------------------------------------------------------------------------


def test_deeply_nested_pickle_as_jsonl_index(datasets, tmp_path):
    for f in datasets["modalities-jsonl"].parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    p = tmp_path / "d.jsonl"
    p.with_suffix(".idx").write_bytes(DEEP_PICKLE)
    with pytest.raises(CorruptDataError, match=r"d\.idx") as ei:
        lmdata.open(p, format="modalities-jsonl")
    assert len(str(ei.value)) < 1000
    assert any("d.idx" in m for m in lmdata.validate(p, format="modalities-jsonl"))
    p.with_suffix(".idx").write_bytes(pickle.dumps([(0, 5), [[[[1]]]]], protocol=4))
    with pytest.raises(CorruptDataError, match=r"entry 1 is \[\[\[\[1\]\]\]\], not a pair"):
        lmdata.open(p, format="modalities-jsonl")


def test_deeply_nested_pickle_as_pbin_index(tmp_path):
    p = tmp_path / "d.pbin"
    with lmdata.writer(p, "modalities", manifest=False, token_width=2) as w:
        w.write(np.array([1, 2, 3], np.uint16))
    raw = p.read_bytes()
    p.write_bytes(raw[: 12 + 6] + DEEP_PICKLE)
    with pytest.raises(CorruptDataError, match=r"d\.pbin"):
        lmdata.open(p, format="modalities")
    assert any("d.pbin" in m for m in lmdata.validate(p, format="modalities"))


def test_describe_is_bounded():
    from lmdata._pickle import describe, safe_loads

    deep = safe_loads(DEEP_PICKLE)
    text = describe(deep)
    assert len(text) <= 80 and text.startswith("[[")
    assert len(describe("x" * 1000, 30)) == 30


# ---- silent acceptance made loud --------------------------------------------------------------


def test_bytes_after_the_pbin_index_are_reported(tmp_path):
    p = tmp_path / "d.pbin"
    with lmdata.writer(p, "modalities", manifest=False, token_width=2) as w:
        w.write(np.array([1, 2, 3], np.uint16))
    assert lmdata.validate(p, format="modalities") == []
    with open(p, "ab") as f:
        f.write(b"\x00" * 10)
    assert len(lmdata.open(p, format="modalities")) == 1  # what modalities reads, too
    problems = lmdata.validate(p, format="modalities")
    assert any("10 bytes follow the end of the pickled index" in m for m in problems), problems


def test_unindexed_jsonl_data_is_reported(tmp_path):
    p = tmp_path / "d.jsonl"
    with lmdata.writer(p, "modalities-jsonl", manifest=False) as w:
        w.write({"a": 1})
    with open(p, "ab") as f:
        f.write(b'{"torn": ')  # a write cut short after the index was built
    problems = lmdata.validate(p, format="modalities-jsonl")
    assert any("unterminated line that is not JSON" in m for m in problems), problems
    with open(p.with_suffix(".idx"), "ab") as f:
        f.write(b"junk")
    problems = lmdata.validate(p, format="modalities-jsonl")
    assert any("4 bytes follow the end of the pickled index" in m for m in problems), problems


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_zero_length_compressed_dolma_files_agree(datasets, tmp_path, suffix):
    root = tmp_path / "d"
    shutil.copytree(datasets["dolma"], root)
    empty = root / "documents" / f"zz-empty{suffix}"
    empty.write_bytes(b"")
    with pytest.raises(CorruptDataError, match="the file is empty") as ei:
        list(lmdata.open(root, format="dolma"))
    assert "zz-empty" in str(ei.value)
    problems = lmdata.validate(root, format="dolma")
    assert any("zz-empty" in m and "the file is empty" in m for m in problems), problems
    # an empty plain .jsonl is an empty file of JSON lines: zero documents, no problem
    empty.unlink()
    (root / "documents" / "zz-empty.jsonl").write_bytes(b"")
    assert len(lmdata.open(root, format="dolma")) == len(RECORDS)
    assert lmdata.validate(root, format="dolma") == []


def test_dolma_compressed_files_holding_no_documents_read_as_empty(tmp_path):
    root = tmp_path / "d"
    (root / "documents").mkdir(parents=True)
    (root / "documents" / "a.jsonl.gz").write_bytes(gzip.compress(b""))
    (root / "documents" / "b.jsonl.zst").write_bytes(zstandard.compress(b""))
    assert len(lmdata.open(root, format="dolma")) == 0


@pytest.mark.parametrize("reader", ["open", "validate"])
def test_an_unterminated_huge_dolma_line_is_refused_in_bounded_memory(tmp_path, reader):
    root = tmp_path / "d"
    (root / "documents").mkdir(parents=True)
    f = root / "documents" / "big.jsonl"
    with open(f, "wb") as out:
        out.write(b'{"id": "1", "text": "a", "source": "s"}\n{"text": "')
        out.truncate(40 << 20)  # one 40 MiB line without a newline (sparse zeros)
    limit = 8 << 20
    tracemalloc.start()
    try:
        if reader == "open":
            with pytest.raises(CorruptDataError, match="longer than max_line_bytes") as ei:
                len(lmdata.open(root, format="dolma", max_line_bytes=limit))
            assert "big.jsonl" in str(ei.value) and "line 2" in str(ei.value)
        else:
            problems = lmdata.validate(root, format="dolma", max_line_bytes=limit)
            assert any("longer than max_line_bytes" in m for m in problems), problems
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * limit, peak  # the line so far, once, plus a read chunk


def test_long_dolma_lines_between_checkpoints_read_back(tmp_path):
    rng = np.random.default_rng(0)
    docs = []
    for i in range(40):
        n = 3 << 20 if i == 17 else int(rng.integers(10, 50_000))
        text = rng.integers(97, 123, n, dtype=np.uint8).tobytes().decode()
        docs.append({"id": str(i), "text": text, "source": "s"})
    root = tmp_path / "d"
    (root / "documents").mkdir(parents=True)
    body = b"".join(json.dumps(d).encode() + b"\n" for d in docs)
    (root / "documents" / "a.jsonl.gz").write_bytes(gzip.compress(body, 1))
    r = lmdata.open(root, format="dolma")
    assert len(r) == 40
    for i in (39, 18, 17, 16, 0, 30):
        assert r[i]["id"] == str(i) and r[i]["text"] == docs[i]["text"]


# ---- atlas zstd frames ------------------------------------------------------------------------


def test_atlas_dictionary_from_another_dataset_is_caught(datasets, tmp_path):
    root = tmp_path / "a"
    shutil.copytree(datasets["atlas"], root)
    other = tmp_path / "other"
    with lmdata.writer(
        other, "atlas", shard_size=30, block_size=4, compression_strategy=2, compression_level=3
    ) as w:
        for r in RECORDS[::-1]:
            w.write({**r, "x": "other"})
    shutil.copy(other / "zstd_dict.bin", root / "zstd_dict.bin")
    with pytest.raises(CorruptDataError, match="dictionary id") as ei:
        lmdata.open(root, format="atlas")[0]
    assert "zstd_dict.bin" in str(ei.value)
    problems = lmdata.validate(root, format="atlas")
    assert any("dictionary id" in m and "zstd_dict.bin" in m for m in problems), problems


def test_atlas_frame_without_content_size_is_refused(tmp_path):
    root = tmp_path / "a"
    with lmdata.writer(
        root, "atlas", shard_size=10, block_size=10, compression_strategy=1, manifest=False
    ) as w:
        for r in RECORDS[:10]:
            w.write(r)
    shard = root / "0"
    # a small frame of many zeros that does not declare its size, as the only block
    # (64 MiB of zeros here keeps the test quick; any size compresses the same way)
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=False)
    frame = b"".join(cctx.read_to_iter(_Zeros(64 << 20)))
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    (shard / "data.bin").write_bytes(frame)
    np.save(shard / "index.npy", np.array([0, len(frame)], np.uint64))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDataError, match="does not declare its content size"):
            lmdata.open(root, format="atlas")[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert any("content size" in m for m in lmdata.validate(root, format="atlas"))


class _Zeros:
    """A file-like source of ``n`` zero bytes."""

    def __init__(self, n: int) -> None:
        self.left = n

    def read(self, size: int = -1) -> bytes:
        k = self.left if size < 0 else min(size, self.left)
        self.left -= k
        return b"\0" * k


def test_truncated_zgroup_is_reported(datasets, tmp_path):
    root = tmp_path / "d.zarr"
    shutil.copytree(datasets["flat-tokens"], root)
    (root / "train" / ".zgroup").write_bytes(b'{"zarr_form')
    problems = lmdata.validate(root, format="flat-tokens")
    assert any("train/.zgroup" in m and "not valid JSON" in m for m in problems), problems
