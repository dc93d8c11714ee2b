"""mix in pieces: a shard of several input files is mixed by one unit per piece (consecutive
whole files), and the pieces are joined into one gzip member holding what one unit writes; the
bytes are the same for every engine and worker count."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import orjson
import pytest

from lmdata.dolma import mixer
from lmdata.dolma import pieces as dolma_pieces
from lmdata.dolma.config import MixerConfig, load_config
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
        assert not any((root / f"m{procs}" / dolma_pieces.PARTS).iterdir())
        got[engine] = raw
    assert got["inprocess"] == got["processes"]
    again = mixer.mix(_one_shard(root, "m1"), engine="inprocess")
    assert again.skipped_shards == 1 and again.read == 0  # an existing shard is kept


def test_cuts_follow_input_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mixer, "PIECE_BYTES", 100)
    assert mixer._cuts([50, 50, 10, 200, 1, 1]) == (0, 2, 4)
    assert mixer._cuts([500]) == (0,)
    assert mixer._cuts([99, 99, 99]) == (0, 2)
