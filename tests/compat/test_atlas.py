"""lmdata.compat.atlas: torch-atlas-ds's classes over lmdata, checked against the origin's files.

The origin is not installable here (it is not on PyPI); its reference datasets in tests/data/atlas
(written by torch-atlas-ds 0.1.0) and the re-implementation of its read path in
tests/formats/test_atlas_compat.py stand in for it.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import zstandard

from lmdata.compat.atlas import (
    AtlasDataset,
    AtlasDatasetMetadata,
    AtlasDatasetShard,
    AtlasDatasetShardMetadata,
    AtlasDatasetShardWriter,
    AtlasDatasetWriter,
    CompressionStrategy,
)
from lmdata.errors import InvalidInputError, OutputExistsError, UnsafeDataError
from tests.formats.test_atlas_compat import DATA, files, origin_examples, origin_read
from tests.formats.test_atlas_safety import _Evil, replace_block


def test_readme_example_runs_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch-atlas-ds's README example with only the import changed."""
    monkeypatch.chdir(tmp_path)
    examples = [{"text": f"example {i}", "label": i % 3} for i in range(2500)]
    # --- from torch-atlas-ds's README ---
    with AtlasDatasetWriter("path/to/dataset", shard_size=1000, block_size=100) as writer:
        for example in examples:
            writer.add_example(example)
    dataset = AtlasDataset("path/to/dataset")
    # --- end of the example ---
    assert len(dataset) == 2500 and dataset[1234] == examples[1234]
    assert sorted(os.listdir("path/to/dataset")) == ["0", "1", "2", "meta.json", "zstd_dict.bin"]
    assert origin_read(tmp_path / "path/to/dataset") == examples
    assert dataset.metadata == AtlasDatasetMetadata(
        1, [1000, 1000, 500], CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    )


def test_strategy0_rewrite_is_byte_identical(tmp_path: Path) -> None:
    with AtlasDatasetWriter(
        tmp_path / "o", 50, 8, compression_strategy=CompressionStrategy.NO_COMPRESSION
    ) as w:
        for e in origin_examples("s0_none"):
            w.add_example(e)
    assert files(tmp_path / "o") == files(DATA / "s0_none")
    assert w.shard_sizes == [50, 50, 20]


def test_shard_writer_rewrites_an_origin_shard(tmp_path: Path) -> None:
    ex = origin_examples("s0_none")[:50]
    with AtlasDatasetShardWriter(tmp_path / "s", 8, CompressionStrategy.NO_COMPRESSION) as w:
        for e in ex:
            w.add_example(e)
        assert len(w) == 50
    assert files(tmp_path / "s") == files(DATA / "s0_none" / "0")
    assert os.listdir(tmp_path) == ["s"]  # the staging folder is gone
    assert w.metadata == AtlasDatasetShardMetadata(1, 8, 50, 0, 3, 0.01)


def test_shard_writer_with_a_shared_dictionary(tmp_path: Path) -> None:
    d = (DATA / "s2_shared" / "zstd_dict.bin").read_bytes()
    ex = origin_examples("s2_shared")[32:64]
    with pytest.raises(InvalidInputError, match="compression_dict"):
        AtlasDatasetShardWriter(
            tmp_path / "x", 4, CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
        )
    cdict = zstandard.ZstdCompressionDict(d)
    with AtlasDatasetShardWriter(
        tmp_path / "s", 4, CompressionStrategy.SHARED_DICTIONARY_COMPRESSION, 3, cdict, 0.1
    ) as w:
        for e in ex:
            w.add_example(e)
    c = zstandard.ZstdCompressor(level=3, dict_data=cdict)
    want = b"".join(c.compress(pickle.dumps(ex[i : i + 4], protocol=4)) for i in range(0, 32, 4))
    assert (tmp_path / "s" / "data.bin").read_bytes() == want
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta == json.loads((DATA / "s2_shared" / "01" / "meta.json").read_text())
    assert not (tmp_path / "s" / "zstd_dict.bin").exists()
    shard = AtlasDatasetShard(tmp_path / "s", compression_dict_bytes=d)
    assert [shard[i] for i in range(len(shard))] == ex


def test_shard_writer_falls_back_below_seven_blocks(tmp_path: Path) -> None:
    with AtlasDatasetShardWriter(tmp_path / "s", block_size=4) as w:  # default: strategy 3
        for i in range(24):
            w.add_example({"i": i})
    assert w.metadata.compression_strategy == CompressionStrategy.STANDARD_COMPRESSION
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["compression_strategy"] == 1


@pytest.mark.parametrize("name", ["s0_none", "s2_shared"])
def test_origin_datasets_read_value_for_value(name: str) -> None:
    expected = [json.loads(line) for line in (DATA / name / "expected.jsonl").open()]
    ds = AtlasDataset(DATA / name)
    assert len(ds) == len(expected)
    assert [ds[i] for i in range(len(ds))] == expected == list(ds)
    assert ds[-1] == expected[-1]
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds[-len(ds) - 1]  # the origin returns a wrong example here


def test_a_shard_opens_away_from_its_root(tmp_path: Path) -> None:
    shutil.copytree(DATA / "s2_shared" / "03", tmp_path / "03")
    d = (DATA / "s2_shared" / "zstd_dict.bin").read_bytes()
    shard = AtlasDatasetShard(tmp_path / "03", compression_dict_bytes=d)
    expected = [json.loads(line) for line in (DATA / "s2_shared" / "expected.jsonl").open()]
    assert [shard[i] for i in range(len(shard))] == expected[96:128]
    assert shard.metadata.compression_strategy == 2 and shard.metadata.block_size == 4
    with pytest.raises(InvalidInputError, match="AtlasDatasetShard"):
        AtlasDataset(tmp_path / "03")


def test_hostile_pickle_is_refused(tmp_path: Path) -> None:
    with AtlasDatasetWriter(tmp_path / "d", 20, 4, CompressionStrategy.STANDARD_COMPRESSION) as w:
        for i in range(40):
            w.add_example({"i": i})
    marker = tmp_path / "pwned"
    evil = pickle.dumps([_Evil(str(marker)), 1, 2, 3], protocol=4)
    replace_block(tmp_path / "d" / "0", 1, zstandard.ZstdCompressor().compress(evil))
    ds = AtlasDataset(tmp_path / "d")
    with pytest.raises(UnsafeDataError, match="allow_unsafe_pickle"):
        ds[5]
    with pytest.raises(UnsafeDataError):
        list(ds)
    assert not marker.exists()
    assert ds[3] == {"i": 3} and ds[39] == {"i": 39}


def test_writer_refuses_code_and_leaves_nothing_on_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="allow_unsafe_pickle"):
        with AtlasDatasetWriter(tmp_path / "d", 10, 2) as w:
            w.add_example({"ok": 1})
            w.add_example(datetime.date(2020, 1, 1))
            w.add_example(datetime.date(2020, 1, 1))
            w.add_example(datetime.date(2020, 1, 1))
    assert not (tmp_path / "d").exists()
    (tmp_path / "e").mkdir()
    with pytest.raises(OutputExistsError):
        AtlasDatasetWriter(tmp_path / "e", 10, 2)
    with pytest.raises(FileExistsError):  # what the origin's mkdir raises
        AtlasDatasetShardWriter(tmp_path / "e", 2)


def _read_in_worker(ds: Any, i: int) -> Any:
    return ds[i]


def test_torch_dataset_in_forked_workers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    ex = [{"i": i, "t": "x" * (i % 5)} for i in range(200)]
    with AtlasDatasetWriter(tmp_path / "d", 64, 8, CompressionStrategy.STANDARD_COMPRESSION) as w:
        for e in ex:
            w.add_example(e)
    ds = AtlasDataset(tmp_path / "d")
    assert isinstance(ds, Dataset)
    assert ds[7] == ex[7]  # touched before the workers fork: the origin's race
    loader = DataLoader(ds, batch_size=16, num_workers=2, shuffle=True)
    got = sorted(torch.cat([b["i"] for b in loader]).tolist())
    assert got == list(range(200))
    assert pickle.loads(pickle.dumps(ds))[199] == ex[199]
