"""Dolma trees: reading dolma's own files, random access, writing, corrupt input."""

from __future__ import annotations

import gzip
import pickle
import shutil
import zlib
from pathlib import Path

import orjson
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.errors import CorruptDataError, FormatError, InvalidInputError, OutputExistsError
from lmdata.formats import dolma
from lmdata.formats.dolma import _lines

DATA = Path(__file__).parent.parent / "data" / "dolma" / "dataset"


def _fixture_docs() -> list[dict]:
    out = []
    for p in sorted((DATA / "documents").glob("*.jsonl.gz")):
        out += [orjson.loads(x) for x in gzip.decompress(p.read_bytes()).splitlines()]
    return out


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(DATA, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def _write_gz(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows)))


def test_reads_dolmas_fixture_in_file_order() -> None:
    want = _fixture_docs()
    r = dolma.open(DATA)
    assert r.format == "dolma" and len(r) == 200
    assert list(r) == want
    assert r[0] == want[0] and r[-1] == want[-1] and r[150] == want[150]
    assert [d["id"] for d in r.take([199, 3, 100, 3])] == [want[i]["id"] for i in (199, 3, 100, 3)]
    assert r.locate(100) == (DATA / "documents" / "part-1.jsonl.gz", 1)
    with pytest.raises(IndexError):
        r[200]


def test_attributes_merged_in_order_given() -> None:
    r = dolma.open(DATA, attributes=["exp", "dedupe_docs"])
    d = r[22]
    assert d["attributes"]["bff_duplicate_url"] == [[0, 50, 1]]
    assert d["attributes"]["exp__char_length_v1__length"] == [[0, 989, 989.0]]
    assert list(r)[22] == d


def test_pickled_reader_reads_the_same() -> None:
    r = dolma.open(DATA, attributes="pii-regex")
    _ = len(r)
    r2 = pickle.loads(pickle.dumps(r))
    assert r2.take([3, 150]) == r.take([3, 150])


def test_misaligned_attribute_ids_name_both_files_and_line(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    ap = root / "attributes" / "exp" / "part-1.jsonl.gz"
    rows = [orjson.loads(x) for x in gzip.decompress(ap.read_bytes()).splitlines()]
    rows[4]["id"] = "wrong"
    _write_gz(ap, rows)
    r = dolma.open(root, attributes=["exp"])
    with pytest.raises(CorruptDataError) as e:
        r[104]
    msg = str(e.value)
    assert "part-1.jsonl.gz" in msg and "attributes/exp" in msg and "line 5" in msg
    assert "documents/part-1.jsonl.gz" in msg
    with pytest.raises(CorruptDataError, match="line 5"):
        list(r)
    r[103]  # the neighbours are fine


def test_short_or_missing_attribute_files_are_errors(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    ap = root / "attributes" / "exp" / "part-0.jsonl.gz"
    rows = [orjson.loads(x) for x in gzip.decompress(ap.read_bytes()).splitlines()]
    _write_gz(ap, rows[:-1])
    with pytest.raises(CorruptDataError, match="99 attribute rows for 100 documents"):
        len(dolma.open(root, attributes=["exp"]))
    with pytest.raises(CorruptDataError, match="more documents"):
        list(dolma.open(root, attributes=["exp"]).iter_located())
    (root / "attributes" / "pii-regex" / "part-1.jsonl.gz").unlink()
    with pytest.raises(FormatError, match="has no file for"):
        dolma.open(root, attributes=["pii-regex"])


def test_random_access_across_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lines, "CHECKPOINT_EVERY", 1)
    monkeypatch.setattr(_lines, "READ_CHUNK", 997)
    monkeypatch.setattr(_lines, "SEGMENT_CACHE", 2)
    rows = [
        {"id": f"d{i}", "text": "x" * (i % 300) + "\u2028é", "source": "s"} for i in range(3000)
    ]
    raw = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    ddir = tmp_path / "t" / "documents"
    ddir.mkdir(parents=True)
    # two gzip members concatenated, a zstd file of two frames, a plain file without final \n
    (ddir / "a.jsonl.gz").write_bytes(gzip.compress(raw[:50001]) + gzip.compress(raw[50001:]))
    z = zstandard.ZstdCompressor()
    (ddir / "b.jsonl.zst").write_bytes(z.compress(raw[:40000]) + z.compress(raw[40000:]))
    (ddir / "c.jsonl").write_bytes(raw[:-1])
    r = dolma.open(tmp_path / "t")
    assert len(r) == 9000
    idx = [8999, 0, 2999, 3000, 4500, 6001, 1234, 7777, 5999, 1]
    assert r.take(idx) == [rows[i % 3000] for i in idx]
    assert [r[i]["id"] for i in range(2990, 3010)] == [
        rows[i % 3000]["id"] for i in range(2990, 3010)
    ]
    assert len(r._index(ddir / "a.jsonl.gz").checkpoints) > 5


def test_truncated_gzip_and_bad_json_are_corrupt_with_place(tmp_path: Path) -> None:
    ddir = tmp_path / "t" / "documents"
    ddir.mkdir(parents=True)
    blob = gzip.compress(
        b"".join(
            orjson.dumps({"id": str(i), "text": "t" * 50, "source": "s"}) + b"\n"
            for i in range(2000)
        )
    )
    (ddir / "a.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CorruptDataError, match="truncated"):
        list(dolma.open(tmp_path / "t"))
    with pytest.raises(CorruptDataError, match=r"a\.jsonl\.gz"):
        len(dolma.open(tmp_path / "t"))
    (ddir / "a.jsonl.gz").write_bytes(
        gzip.compress(b'{"id": "1", "text": "a", "source": "s"}\n{"id": "2", "text": \n')
    )
    r = dolma.open(tmp_path / "t")
    assert r[0]["id"] == "1"
    with pytest.raises(CorruptDataError, match="line 2"):
        r[1]


def test_detect_is_specific(tmp_path: Path) -> None:
    assert dolma.detect(DATA)
    assert not dolma.detect(DATA / "documents" / "part-0.jsonl.gz")
    (tmp_path / "documents").mkdir()
    assert not dolma.detect(tmp_path)  # no document files
    (tmp_path / "documents" / "x.txt").write_text("hi")
    assert not dolma.detect(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.jsonl").write_text("{}\n")
    assert not dolma.detect(tmp_path / "other")


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)
_doc = st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=8), "text": _text},
    optional={
        "source": st.sampled_from(["a", "b"]),
        "metadata": st.dictionaries(
            st.text(max_size=5),
            st.one_of(
                st.integers(-(2**63), 2**63 - 1),
                st.floats(allow_nan=False, allow_infinity=False),
                _text,
            ),
            max_size=3,
        ),
    },
)


@settings(max_examples=25, deadline=None)
@given(
    docs=st.lists(_doc, max_size=30),
    per_file=st.integers(1, 7),
    compression=st.sampled_from(["gz", "zst", "none"]),
)
def test_writer_round_trip(
    tmp_path_factory: pytest.TempPathFactory, docs: list[dict], per_file: int, compression: str
) -> None:
    out = tmp_path_factory.mktemp("w") / "tree"
    with dolma.Writer(out, compression=compression, max_file_docs=per_file, source="dflt") as w:
        for d in docs:
            w.write(d)
    r = dolma.open(out)
    want = [{**d, "source": d.get("source", "dflt")} for d in docs]
    assert list(r) == want
    assert len(r) == len(docs)
    assert dolma.validate(out) == [] or len({(d["source"], d["id"]) for d in want}) < len(want)


def test_writer_fills_ids_and_is_atomic(tmp_path: Path) -> None:
    out = tmp_path / "t"
    with dolma.Writer(out) as w:
        w.write({"id": 7, "text": "a"})
        w.write({"text": "b"})
    assert [(d["id"], d["source"]) for d in dolma.open(out)] == [("7", "t"), ("1", "t")]
    f = next((out / "documents").iterdir())
    assert f.name == "part-00000.jsonl.gz" and f.read_bytes()[4:8] == b"\0\0\0\0"  # mtime 0
    with pytest.raises(OutputExistsError):
        dolma.Writer(out)
    with (
        pytest.raises(InvalidInputError, match="'text' must be a string"),
        dolma.Writer(tmp_path / "u") as w,
    ):
        w.write({"id": "1", "text": "fine"})
        w.write({"id": "2"})
    with (
        pytest.raises(InvalidInputError, match="cannot be stored as JSON"),
        dolma.Writer(tmp_path / "v") as w,
    ):
        w.write({"id": "1", "text": "x", "n": 2**70})
    with (
        pytest.raises(InvalidInputError, match=r"value\['m'\]\[1\] is not finite"),
        dolma.Writer(tmp_path / "v") as w,
    ):
        w.write({"id": "1", "text": "x", "m": [1.0, float("nan")]})
    assert not (tmp_path / "u").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lmdata-tmp")]


def test_info_counts(tmp_path: Path) -> None:
    i = dolma.info(DATA)
    assert i["documents"] == 200 and i["files"] == 2 and i["codecs"] == {"gz": 2}
    assert set(i["attribute_sets"]) == {"exp", "pii-regex", "dedupe_docs", "dedupe_paragraphs"}


def test_zlib_error_type_is_wrapped() -> None:
    # guard: the decoder errors we translate include those of the zlib we decode with
    from zlib_ng import zlib_ng

    from lmdata.formats.dolma._files import DECODE_ERRORS

    assert zlib_ng.error in DECODE_ERRORS


@settings(max_examples=60, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_corrupted_files_fail_cleanly(
    tmp_path_factory: pytest.TempPathFactory, flips: list[tuple[int, int]], cut: int | None
) -> None:
    from lmdata.errors import LmdataError

    blob = bytearray((DATA / "documents" / "part-0.jsonl.gz").read_bytes())
    for pos, x in flips:
        blob[pos % len(blob)] ^= x
    if cut is not None:
        blob = blob[: cut % len(blob)]
    root = tmp_path_factory.mktemp("c")
    (root / "documents").mkdir()
    (root / "documents" / "p.jsonl.gz").write_bytes(bytes(blob))
    try:
        r = dolma.open(root)
        docs = list(r.iter_located())
        assert len(r) == len(docs)
        r.take(list(range(len(r))))
    except LmdataError as e:
        assert "p.jsonl.gz" in str(e)
    assert isinstance(dolma.validate(root), list)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst", ".jsonl"])
def test_overlong_line_is_refused_with_file_and_line(tmp_path: Path, suffix: str) -> None:
    """A decompression bomb (one huge line) is a CorruptDataError, never a giant allocation."""

    from lmdata.formats.dolma import _files

    ddir = tmp_path / "t" / "documents"
    ddir.mkdir(parents=True)

    def ok(i: int) -> bytes:
        return orjson.dumps({"id": str(i), "text": "a", "source": "s"}) + b"\n"

    big = b'{"id": "3", "text": "' + b"x" * 5_000_000 + b'", "source": "s"}\n'
    raw = ok(1) + ok(2) + big + ok(4)
    f = ddir / f"a{suffix}"
    if suffix == ".jsonl.gz":
        f.write_bytes(gzip.compress(raw))
    elif suffix == ".jsonl.zst":
        f.write_bytes(zstandard.ZstdCompressor().compress(raw))
    else:
        f.write_bytes(raw)
    cap = 1 << 20
    r = dolma.open(tmp_path / "t", max_line_bytes=cap)
    for use in (len, list, lambda r: r[0]):
        with pytest.raises(CorruptDataError, match="max_line_bytes=1048576") as e:
            use(r)
        assert e.value.path == str(f) and e.value.position == "line 3"
    with pytest.raises(CorruptDataError, match="line 3"):
        dolma.info(tmp_path / "t", max_line_bytes=cap)
    problems = dolma.validate(tmp_path / "t", max_line_bytes=cap)
    assert len(problems) == 1 and f"{f}: line 3" in problems[0], problems
    # The default cap reads the same file.
    assert len(dolma.open(tmp_path / "t")) == 4
    assert _files.MAX_LINE_BYTES == 256 << 20
    with pytest.raises(InvalidInputError):
        dolma.open(tmp_path / "t", max_line_bytes=0)


def test_overlong_line_never_held_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracemalloc

    from lmdata.formats.dolma import _files

    monkeypatch.setattr(_files, "OUT_PIECE", 1 << 20)
    ddir = tmp_path / "t" / "documents"
    ddir.mkdir(parents=True)
    f = ddir / "bomb.jsonl.gz"
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [c.compress(b'{"id": "1", "text": "')]
    block = b"x" * (1 << 20)
    parts += [c.compress(block) for _ in range(200)]  # a 200 MiB line from a ~200 KB file
    parts.append(c.compress(b'"}\n') + c.flush())
    f.write_bytes(b"".join(parts))
    assert f.stat().st_size < 1 << 20
    for read in (len, list):
        r = dolma.open(tmp_path / "t", max_line_bytes=4 << 20)
        tracemalloc.start()
        try:
            with pytest.raises(CorruptDataError, match="line 1"):
                read(r)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 32 << 20, peak


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=3000), max_size=12),
    level=st.sampled_from([1, 6, 9]),
)
def test_gzip_writer_writes_one_gzip_member(chunks: list[bytes], level: int) -> None:
    import io

    from lmdata.formats.dolma._output import GzipWriter

    def written(parts: list[bytes], block: int) -> bytes:
        buf = io.BytesIO()
        w = GzipWriter(buf, level)
        w.BLOCK = block
        for p in parts:
            w.write(p)
        w.close()
        return buf.getvalue()

    data = b"".join(chunks)
    out = written(chunks, 7)
    assert gzip.decompress(out) == data  # CRC-32 and size checked by gzip itself
    assert gzip.decompress(written([data], 1 << 20)) == data
    # the header Python's gzip writes with mtime=0 and no name, at the same level
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=level) as g:
        g.write(data)
    assert out[:10] == buf.getvalue()[:10]
