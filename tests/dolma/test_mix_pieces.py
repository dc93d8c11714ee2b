"""mix in pieces: a shard of several input files is mixed by one unit per piece (consecutive
whole files), and the pieces are joined into one gzip member holding what one unit writes; the
bytes are the same for every engine and worker count."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.dolma import _ranges, mixer
from lmdata.dolma import pieces as dolma_pieces
from lmdata.dolma.config import MixerConfig, load_config
from lmdata.dolma.mixing import Source
from lmdata.formats.dolma import _files
from tests.dolma.test_mixer import _copy, _expected


def _one_shard(root: Path, out: str, processes: int = 1) -> MixerConfig:
    cfg = load_config(str(root / "configs" / "mix.yaml"))
    cfg["processes"] = processes
    cfg["streams"][0]["output"]["path"] = out
    cfg["streams"][0]["output"]["max_size_in_bytes"] = 10**9  # both inputs in one shard
    return MixerConfig.from_dict(cfg)


def test_pieces_join_into_the_shard_one_unit_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy(tmp_path)
    monkeypatch.chdir(root)
    whole = mixer.mix(_one_shard(root, "whole"), engine="inprocess")
    assert whole.shards == 1
    one = gzip.decompress((root / whole.outputs[0]).read_bytes())
    assert [orjson.loads(x) for x in one.splitlines()] == _expected(root)

    monkeypatch.setattr(mixer, "PIECE_BYTES", 1)  # every input file a piece of its own
    (shard,) = mixer.plan_shards(_one_shard(root, "x").streams[0], root)
    assert shard.cuts == (0, 1) and len(shard.inputs) == 2
    got = {}
    for engine, procs in (("inprocess", 1), ("processes", 2)):
        res = mixer.mix(_one_shard(root, f"m{procs}", procs), engine=engine)
        assert (res.shards, res.read, res.written) == (1, whole.read, whole.written)
        raw = (root / res.outputs[0]).read_bytes()
        d = zlib.decompressobj(31)
        assert d.decompress(raw) == one and d.eof and d.unused_data == b""  # one member
        left = [p for p in (root / f"m{procs}").iterdir() if p.name.startswith(dolma_pieces.PARTS)]
        assert left == []  # the pieces' folder is gone too
        got[engine] = raw
    assert got["inprocess"] == got["processes"]
    again = mixer.mix(_one_shard(root, "m1"), engine="inprocess")
    assert again.skipped_shards == 1 and again.read == 0  # an existing shard is kept


def _whole(*sizes: int) -> list[tuple[Source, int]]:
    return [(Source(f"f{k}"), z) for k, z in enumerate(sizes)]


def test_cuts_follow_input_sizes_and_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mixer, "PIECE_BYTES", 100)
    assert mixer._cuts(_whole(50, 50, 10, 200, 1, 1)) == (0, 2, 4)
    assert mixer._cuts(_whole(500)) == (0,)
    assert mixer._cuts(_whole(99, 99, 99)) == (0, 2)
    # a range of a file is a piece of its own, however small; whole files still gather
    ranges = [(Source("r", a, a + 10), 10) for a in (0, 10, 20)]
    sources = _whole(30, 30) + ranges + _whole(60, 60, 60)
    assert mixer._cuts(sources) == (0, 2, 3, 4, 5, 7)


def _ranged_tree(root: Path, n: int, short_attrs: int) -> Path:
    """A plain input of ``n`` documents (lines of varied length, one longer than a range) with
    one attribute set of ``short_attrs`` rows (shorter than the documents; plain, as its name
    mirrors the document file's), a second plain document file, and a missing attribute set."""
    ddir = root / "documents"
    ddir.mkdir(parents=True)
    docs = [
        {"id": f"d{i}", "text": ("w " * (i % 23)) + ("x" * 300 if i == 7 else "") + "end"}
        for i in range(n)
    ]
    (ddir / "big.jsonl").write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    (ddir / "small.jsonl").write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs[:5]))
    adir = root / "attributes" / "a"
    adir.mkdir(parents=True)
    rows = [{"id": f"d{i}", "attributes": {"a__len": [[0, 1, i % 3]]}} for i in range(n)]
    for name, k in (("big.jsonl", short_attrs), ("small.jsonl", 5)):
        (adir / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows[:k]))
    return root


def _one_stream_cfg(
    root: Path, out: str, processes: int, attributes: list[str], exclude: str
) -> MixerConfig:
    """Mix stream ``m``: the plain documents below ``root/documents`` with ``attributes`` merged,
    the documents ``exclude`` matches left out, into one shard ``root/out/m-0000.jsonl.gz``."""
    return MixerConfig.from_dict(
        {
            "processes": processes,
            "streams": [
                {
                    "name": "m",
                    "documents": [str(root / "documents" / "*.jsonl")],
                    "attributes": attributes,
                    "filter": {"exclude": [exclude]},
                    "output": {"path": str(root / out), "max_size_in_bytes": 10**9},
                }
            ],
        }
    )


def _ranged_cfg(root: Path, out: str, processes: int) -> MixerConfig:
    return _one_stream_cfg(
        root, out, processes, ["a", "gone"], "$.attributes[?(@.a__len[0][2] == 2)]"
    )


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(range_bytes=st.integers(40, 900), short=st.integers(0, 60), chunk=st.integers(5, 300))
def test_one_plain_input_is_mixed_in_ranges_with_its_line_numbers(
    tmp_path_factory: pytest.TempPathFactory, range_bytes: int, short: int, chunk: int
) -> None:
    # a large plain input is cut into byte ranges (units of their own); its documents,
    # provenance line numbers, attribute rows and warnings are those of one unit, and the
    # bytes are the same for every engine and worker count
    root = _ranged_tree(tmp_path_factory.mktemp("r"), 60, short)
    whole = mixer.mix(_ranged_cfg(root, "whole", 1), engine="inprocess")
    want = gzip.decompress((root / "whole" / "m-0000.jsonl.gz").read_bytes())
    # the attributes were merged: the rows saying 2 are filtered out (and d2 of small.jsonl)
    assert whole.filtered == sum(i % 3 == 2 for i in range(min(short, 60))) + 1
    for line in want.splitlines():  # document d<i> is line i + 1 of its file
        doc = orjson.loads(line)
        assert doc["metadata"]["provenance"].endswith(f":{int(doc['id'][1:]) + 1}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_ranges, "RANGE_BYTES", range_bytes)
        mp.setattr(mixer, "PIECE_BYTES", 1)
        mp.setattr(_files, "READ_CHUNK", chunk)  # rows found across reads (in this process)
        (shard,) = mixer.plan_shards(_ranged_cfg(root, "x", 1).streams[0])
        assert len(shard.sources) > 2 and shard.inputs == tuple(
            str(root / "documents" / f) for f in ("big.jsonl", "small.jsonl")
        )
        got = []
        for engine, procs in (("inprocess", 1), ("processes", 2)):
            res = mixer.mix(_ranged_cfg(root, f"m{procs}", procs), engine=engine)
            assert (res.read, res.written, res.filtered) == (
                whole.read,
                whole.written,
                whole.filtered,
            )
            assert res.warnings == whole.warnings
            raw = (root / f"m{procs}" / "m-0000.jsonl.gz").read_bytes()
            d = zlib.decompressobj(31)
            assert d.decompress(raw) == want and d.eof and d.unused_data == b""
            got.append(raw)
        assert got[0] == got[1]


def test_mix_reads_what_tag_wrote_for_a_plain_file(tmp_path: Path) -> None:
    # tag writes a plain document file's attributes plainly (their name has no .gz), so mix,
    # which decodes a file by its name, merges them (gzip bytes there failed the shard)
    from lmdata.dolma.config import TagConfig
    from lmdata.dolma.tag import tag

    root = _ranged_tree(tmp_path, 30, 30)
    docs = str(root / "documents" / "*.jsonl")
    tag(TagConfig.from_dict({"documents": [docs], "taggers": ["char_length_v1"]}))
    raw = (root / "attributes" / "char_length_v1" / "big.jsonl").read_bytes()
    assert orjson.loads(raw.splitlines()[0])["id"] == "d0"
    cfg = MixerConfig.from_dict(
        {
            "streams": [
                {
                    "name": "m",
                    "documents": [docs],
                    "attributes": ["char_length_v1"],
                    "filter": {
                        "include": [
                            "$.attributes[?(@.char_length_v1__char_length_v1__length[0][2] > 10)]"
                        ]
                    },
                    "output": {"path": str(root / "out"), "max_size_in_bytes": 10**9},
                }
            ]
        }
    )
    res = mixer.mix(cfg, engine="inprocess")
    assert res.read == 35 and 0 < res.written < 35 and not res.warnings
