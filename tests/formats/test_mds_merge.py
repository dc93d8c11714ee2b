"""``lmdata merge`` for streaming datasets, including JSONL partitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.errors import OutputExistsError
from lmdata.formats.mds import merge


def part(d: Path, fmt: str, start: int, n: int, **kw) -> None:
    cols = {"id": "int", "txt": "str"}
    with lmdata.writer(d, fmt, columns=cols, **kw) as w:
        for i in range(start, start + n):
            w.write({"id": i, "txt": f"doc {i}"})


@pytest.mark.parametrize("fmt", ["mds", "mds-csv", "mds-jsonl"])
def test_merge_a_folder_of_partitions(tmp_path: Path, fmt: str) -> None:
    root = tmp_path / "out"
    for k in range(11):  # natural order: 2 before 10
        part(root / str(k), fmt, 10 * k, 3, size_limit=60, compression="zstd" if k % 2 else None)
    msg = merge([str(root)], str(root))
    assert msg.inputs == 11 and msg.format == "mds"
    idx = json.loads((root / "index.json").read_text())
    assert idx["shards"][0]["raw_data"]["basename"].startswith("0/")
    r = lmdata.open(root)
    assert [x["id"] for x in r] == [10 * k + j for k in range(11) for j in range(3)]
    assert lmdata.validate(root) == []


def test_merge_partitions_outside_the_output_links_them_in(tmp_path: Path) -> None:
    part(tmp_path / "a", "mds", 0, 4)
    part(tmp_path / "b", "mds", 4, 2)
    merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "out"))
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["a", "b", "index.json", "lmdata-manifest"]
    assert [x["id"] for x in lmdata.open(tmp_path / "out")] == list(range(6))


def test_merge_of_file_urls_is_the_local_merge(tmp_path: Path) -> None:
    part(tmp_path / "a", "mds", 0, 4)
    part(tmp_path / "b", "mds", 4, 2)
    out = tmp_path / "out"
    merge([(tmp_path / "a").as_uri(), (tmp_path / "b").as_uri()], out.as_uri())
    assert sorted(p.name for p in out.iterdir()) == ["a", "b", "index.json", "lmdata-manifest"]
    assert [x["id"] for x in lmdata.open(out)] == list(range(6))


def test_merge_reads_each_partition_index_once(tmp_path: Path, monkeypatch) -> None:
    from lmdata import _json

    for k in range(3):
        part(tmp_path / "out" / str(k), "mds", k, 1)
    parsed: list[bytes] = []
    real = _json.parse
    monkeypatch.setattr(_json, "parse", lambda data, *a: parsed.append(data) or real(data, *a))
    merge([str(tmp_path / "out")], str(tmp_path / "out"))
    indexes = [d for d in parsed if not bytes(d).startswith(b'{"lmdata_manifest"')]
    assert len(indexes) == 3  # one parse per partition, with the index's one size limit
    assert len(parsed) == 6  # and each partition's manifest, whose entries the merge keeps
    assert [x["id"] for x in lmdata.open(tmp_path / "out")] == [0, 1, 2]


def test_merge_nested_indexes_again(tmp_path: Path) -> None:
    root = tmp_path / "top"
    for g in range(2):
        for k in range(2):
            part(root / f"g{g}" / str(k), "mds", 100 * g + 10 * k, 2)
        merge([str(root / f"g{g}")], str(root / f"g{g}"))
    merge([str(root / "g0"), str(root / "g1")], str(root))
    idx = json.loads((root / "index.json").read_text())
    assert idx["shards"][-1]["raw_data"]["basename"] == "g1/1/shard.00000.mds"
    assert [x["id"] for x in lmdata.open(root)] == [0, 1, 10, 11, 100, 101, 110, 111]


def test_merge_refuses_to_replace_an_index(tmp_path: Path) -> None:
    part(tmp_path / "out" / "0", "mds", 0, 2)
    merge([str(tmp_path / "out")], str(tmp_path / "out"))
    with pytest.raises(OutputExistsError):
        merge([str(tmp_path / "out" / "0")], str(tmp_path / "out"))
    merge([str(tmp_path / "out" / "0")], str(tmp_path / "out"), overwrite=True)


def test_cli_merge(tmp_path: Path) -> None:
    for k in range(2):
        part(tmp_path / "out" / str(k), "mds-jsonl", 5 * k, 5)
    res = CliRunner().invoke(
        cli,
        [
            "merge",
            str(tmp_path / "out" / "0"),
            str(tmp_path / "out" / "1"),
            "-o",
            str(tmp_path / "out"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert len(lmdata.open(tmp_path / "out")) == 10
