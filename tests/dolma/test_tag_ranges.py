"""tag in byte ranges: a plain JSONL file larger than its range size is tagged by several units, and
the attribute files hold the same rows, in the same order, as one unit gives; the bytes are the
same for every engine and worker count (a plain attribute file for a plain document file: the
name says the codec); compressed files stay one unit."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata import parallel
from lmdata.dolma import _ranges
from lmdata.dolma import pieces as dolma_pieces
from lmdata.dolma import tag as tg
from lmdata.dolma.config import TagConfig
from lmdata.errors import CorruptDataError
from lmdata.formats.dolma import _files
from lmdata.formats.dolma._output import OutputFile, Part, join_parts
from lmdata.storage import resolve

TAGGERS = ["char_length_v1", "whitespace_tokenizer_v1"]


def _docs(n: int, start: int = 0) -> bytes:
    return b"".join(
        orjson.dumps({"id": f"d{i}", "text": "word " * (i % 37) + "end", "source": "s"}) + b"\n"
        for i in range(start, start + n)
    )


def _tree(root: Path, name: str, data: bytes) -> Path:
    ddir = root / "documents"
    ddir.mkdir(parents=True, exist_ok=True)
    (ddir / name).write_bytes(data)
    return root


def _run(root: Path, engine: str = "inprocess", processes: int = 1, **kw) -> tg.TagResult:
    cfg = TagConfig.from_dict(
        {
            "documents": [str(root / "documents" / "*")],
            "taggers": TAGGERS,
            "experiment": "x",
            "processes": processes,
            "ignore_existing": True,
            **kw,
        }
    )
    return tg.tag(cfg, engine=engine)


def _tasks(cfg: TagConfig, files: list[str]) -> list[tg.TagTask]:
    return [t for p in tg._plan(cfg, files) for t in p.tasks]


def _no_parts(folder: Path) -> bool:
    """No piece folder (of any job) is left in ``folder``."""
    return not [p for p in folder.iterdir() if p.name.startswith(dolma_pieces.PARTS)]


def _attr(root: Path, name: str) -> bytes:
    return (
        root / "attributes" / "x" / (name + ".gz" if not name.endswith(".gz") else name)
    ).read_bytes()


def test_ranges_give_the_rows_of_one_unit_and_bytes_independent_of_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _docs(400)
    whole = _tree(tmp_path / "whole", "a.jsonl", data)
    assert _run(whole).documents == 400
    # the attribute file of a plain document file is plain (readers go by the name)
    one_unit = (whole / "attributes" / "x" / "a.jsonl").read_bytes()
    assert [orjson.loads(x)["id"] for x in one_unit.splitlines()] == [f"d{i}" for i in range(400)]
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 997)  # not a multiple of any line length
    tasks = _tasks(
        TagConfig.from_dict({"documents": [str(whole / "documents" / "*")], "taggers": TAGGERS}),
        [str(whole / "documents" / "a.jsonl")],
    )
    assert len(tasks) == -(-len(data) // 997) > 10
    outs = {}
    for engine, procs in (("inprocess", 1), ("processes", 2)):
        root = _tree(tmp_path / f"{engine}{procs}", "a.jsonl", data)
        res = _run(root, engine, procs)
        assert res.documents == 400 and res.files == 1
        raw = (root / "attributes" / "x" / "a.jsonl").read_bytes()
        outs[engine] = raw
        assert raw == one_unit
        # the pieces and their folder are gone: `lmdata clean` finds nothing after a good run
        assert _no_parts(root / "attributes" / "x")
    assert outs["inprocess"] == outs["processes"]


def test_compressed_and_small_files_are_one_unit(tmp_path: Path) -> None:
    cfg = TagConfig.from_dict({"documents": ["x"], "taggers": TAGGERS})
    root = _tree(tmp_path / "t", "a.jsonl.gz", gzip.compress(_docs(50)))
    _tree(root, "b.jsonl", _docs(5))
    tasks = _tasks(cfg, [str(root / "documents" / n) for n in ("a.jsonl.gz", "b.jsonl")])
    assert [(t.parts, t.start, t.end) for t in tasks] == [(1, 0, -1), (1, 0, -1)]


def test_error_in_a_later_range_names_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _docs(300) + b'{"id": "bad"}\n' + _docs(10, 300)
    root = _tree(tmp_path / "t", "a.jsonl", data)
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 1000)
    with pytest.raises(CorruptDataError, match="no string 'text'") as e:
        _run(root)
    assert e.value.position == "line 301"
    assert not (root / "attributes" / "x" / "a.jsonl").exists()  # nothing half-written


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=25),
    newline_at_end=st.booleans(),
    size=st.integers(1, 60),
    chunk=st.integers(1, 17),
)
def test_ranges_tile_the_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines, newline_at_end, size, chunk
) -> None:
    """Every line of a plain file is read by exactly one of the ranges that tile it."""
    data = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    p = tmp_path / "f.jsonl"
    p.write_bytes(data)
    store, key = resolve(str(p))
    monkeypatch.setattr(_files, "READ_CHUNK", chunk)
    got = [
        x
        for s in range(0, max(len(data), 1), size)
        for x in _files.iter_range_lines(store, key, s, min(s + size, len(data)))
    ]
    want, off = [], 0
    for ln in lines:
        want.append((off, ln))
        off += len(ln) + 1
    if lines and not newline_at_end and lines[-1] == b"":
        want.pop()  # a file ending in "\n" has no empty last line
    assert got == want
    for o, _ in got:
        assert _files.line_number_at(store, key, o) == data.count(b"\n", 0, o) + 1


@pytest.mark.parametrize("compression", ["gz", "zst", "none"])
def test_pieces_join_to_the_single_writer_bytes(tmp_path: Path, compression: str) -> None:
    """One piece is exactly the single-unit file; several decode to the same bytes."""
    store, root = resolve(str(tmp_path))
    chunks = [b"a" * 70_000, b"", b"xyz\n" * 5000, b"q"]
    with OutputFile(store, f"{root}/whole", compression) as f:
        f.write(b"".join(chunks))
    for pieces in ([b"".join(chunks)], chunks):
        keys = _write_and_join(store, f"{root}/joined{len(pieces)}", compression, pieces)
        assert not any(Path(k).exists() for k in keys)
    one = (tmp_path / "joined1").read_bytes()
    assert one == (tmp_path / "whole").read_bytes()
    many = (tmp_path / "joined4").read_bytes()
    if compression == "gz":
        assert gzip.decompress(many) == b"".join(chunks)
        d = zlib.decompressobj(31)
        d.decompress(many)
        assert d.eof and d.unused_data == b""  # one member, trailer CRC checked by zlib


def test_ranges_on_an_object_store_give_the_local_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_root: str
) -> None:
    data = _docs(120)
    monkeypatch.setattr(_ranges, "RANGE_BYTES", 1500)
    local = _tree(tmp_path / "l", "a.jsonl", data)
    _run(local)
    store, key = resolve(f"{memory_root}/documents/a.jsonl")
    store.put(key, data)
    cfg = TagConfig.from_dict(
        {
            "documents": [f"{memory_root}/documents/*.jsonl"],
            "taggers": TAGGERS,
            "experiment": "x",
            "ignore_existing": True,
        }
    )
    seen = []
    real = parallel.run_all

    def recorded(fn, units, **kw):
        seen.append(kw["what"])
        return real(fn, units, **kw)

    monkeypatch.setattr(parallel, "run_all", recorded)
    assert tg.tag(cfg, engine="inprocess").documents == 120
    assert seen == ["tag", "join"]  # on a store, the join is a unit of the executor
    got = store.read(resolve(f"{memory_root}/attributes/x/a.jsonl")[1])
    assert got == (local / "attributes" / "x" / "a.jsonl").read_bytes()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(st.binary(max_size=3000), min_size=1, max_size=6),
    compression=st.sampled_from(["gz", "zst", "none"]),
)
def test_any_pieces_join_to_their_concatenation(tmp_path: Path, pieces, compression) -> None:
    """Round trip: whatever the pieces (empty ones too), the joined file decodes to their bytes
    in order; a gzip one is a single member whose trailer CRC and size zlib checks."""
    import uuid

    store, root = resolve(str(tmp_path))
    run = uuid.uuid4().hex
    _write_and_join(store, f"{root}/{run}", compression, pieces)
    raw = (tmp_path / run).read_bytes()
    if compression == "gz":
        d = zlib.decompressobj(31)
        out = d.decompress(raw)
        assert d.eof and d.unused_data == b""
    elif compression == "zst":
        out = b"".join(_zstd_frames(raw))  # a frame per piece
    else:
        out = raw
    assert out == b"".join(pieces)


def _write_and_join(store, key: str, compression: str, pieces: list[bytes]) -> list[str]:
    """Write each piece as a part (first/last marked) and join them into ``key``; the part keys."""
    keys, sums = [], []
    for k, data in enumerate(pieces):
        with OutputFile(
            store, f"{key}.{k}", compression, part=Part(k == 0, k == len(pieces) - 1)
        ) as f:
            f.write(data)
        sums.append(f.checksum())
        keys.append(f"{key}.{k}")
    join_parts(store, key, compression, keys, sums)
    return keys


def _zstd_frames(raw: bytes):
    import zstandard

    while raw:
        d = zstandard.ZstdDecompressor().decompressobj()
        yield d.decompress(raw)
        raw = d.unused_data


def test_pieces_a_killed_job_left_are_found_by_clean(tmp_path: Path) -> None:
    from lmdata.storage.clean import find_leftovers

    store, root = resolve(str(tmp_path))
    key = dolma_pieces.part_key(f"{root}/attributes/x/a.jsonl.gz", 3)
    with OutputFile(store, key, "gz", part=Part(False, False)) as f:
        f.write(b"{}\n")
    (found,) = find_leftovers(store, root, older_than=0)
    assert found.kind == "staged" and found.url.endswith(dolma_pieces.PARTS)
    assert found.bytes > 0 and found.url in found.remove  # the folder goes, with the piece


def test_a_missing_piece_is_an_error_naming_it(tmp_path: Path) -> None:
    from lmdata.errors import DatasetNotFoundError

    store, root = resolve(str(tmp_path))
    out = f"{root}/attributes/x/a.jsonl"
    first = dolma_pieces.part_key(out, 0)
    with OutputFile(store, first, "none", part=Part(False, False)) as f:
        f.write(b"{}\n")
    missing = dolma_pieces.part_key(out, 1)
    with pytest.raises(DatasetNotFoundError, match=r"piece 1 of .*a\.jsonl is missing"):
        join_parts(store, out, "none", [first, missing], [(0, 3), (0, 0)])
    assert not (tmp_path / "attributes" / "x" / "a.jsonl").exists()  # nothing half-written
