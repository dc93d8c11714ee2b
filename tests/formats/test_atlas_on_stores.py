"""Atlas merge and append on object stores (memory://, s3:// on the moto server) give the same
bytes as on local disk, and a failed or concurrent append leaves the previous dataset intact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import lmdata
from lmdata.errors import OutputExistsError
from lmdata.formats import atlas
from lmdata.storage import LocalStore, basename, join, parent, resolve

from .test_atlas_compat import examples


def _write(where: str, items: list[Any], **kw: Any) -> str:
    with atlas.Writer(where, **kw) as w:
        for it in items:
            w.write(it)
    return where


def _files(where: str) -> dict[str, bytes]:
    """Every object of the dataset at ``where`` by its path inside it (lmdata's own skipped)."""
    store, key = resolve(where)
    out: dict[str, bytes] = {}

    def walk(k: str, prefix: str) -> None:
        for name in store.list(k):
            child = join(k, name)
            if store.is_dir(child):
                walk(child, f"{prefix}{name}/")
            else:
                out[prefix + name] = store.read(child)

    walk(key, "")
    return out


INPUTS = {  # name -> (examples, writer options): linked shards and a re-encoded one
    "a": (examples(60, seed=1), {"shard_size": 25, "block_size": 2}),
    "b": (examples(40, seed=2), {"shard_size": 30, "block_size": 2}),  # another dictionary
    "c": (examples(30, seed=3), {"shard_size": 20, "block_size": 3, "compression_strategy": 1}),
}


def test_merge_on_a_store_is_byte_identical_to_the_local_merge(where, tmp_path: Path) -> None:
    local = {n: _write(str(tmp_path / f"in-{n}"), ex, **kw) for n, (ex, kw) in INPUTS.items()}
    atlas.merge(list(local.values()), str(tmp_path / "merged"))
    remote = {n: _write(f"{where}-{n}", ex, **kw) for n, (ex, kw) in INPUTS.items()}
    assert _files(remote["a"]) == _files(local["a"])
    atlas.merge(list(remote.values()), where)
    got = _files(where)
    assert got == _files(str(tmp_path / "merged"))
    assert "zstd_dict.bin" in got and "4/data.bin" in got  # 3 + 2 + 2 shards, re-encoded b
    assert list(lmdata.open(where)) == [x for ex, _ in INPUTS.values() for x in ex]
    assert lmdata.validate(where) == []


def test_merge_refuses_an_existing_output_on_a_store(where, tmp_path: Path) -> None:
    src = _write(f"{where}-a", examples(10), block_size=2)
    _write(where, examples(3), block_size=2)
    with pytest.raises(OutputExistsError):
        atlas.merge([src], where)
    atlas.merge([src], where, overwrite=True)
    assert len(lmdata.open(where)) == 10


def test_append_on_a_store_is_byte_identical_to_the_local_append(where, tmp_path: Path) -> None:
    first, more = examples(18, seed=4), examples(5, seed=5)
    for loc in (str(tmp_path / "local"), where):
        _write(loc, first, shard_size=2, block_size=2, compression_strategy=1)
        with atlas.Writer(loc, append=True) as w:  # 9 shards (0..8) become 12 (00..11)
            for x in more:
                w.write(x)
    got = _files(where)
    assert got == _files(str(tmp_path / "local"))
    assert "11/meta.json" in got and "8/meta.json" not in got
    assert list(lmdata.open(where)) == first + more


def test_failed_append_on_a_store_leaves_the_dataset_as_it_was(where) -> None:
    first = examples(20, seed=6)
    _write(where, first, shard_size=8, block_size=2)
    before = _files(where)
    with pytest.raises(RuntimeError), atlas.Writer(where, append=True) as w:
        for x in examples(30, seed=7):
            w.write(x)
        raise RuntimeError("killed")
    assert _files(where) == before  # no claim, staging or new shard left either
    assert list(lmdata.open(where)) == first


def test_an_append_on_a_store_keeps_other_writers_out(where) -> None:
    store, key = resolve(where)
    if isinstance(store, LocalStore):
        pytest.skip("local appends swap a folder in; the claim is an object-store mechanism")
    _write(where, examples(6), block_size=2)
    w = atlas.Writer(where, append=True)
    w.write({"id": 99})
    claim = join(parent(key), f".lmdata-writing-{basename(key)}")  # beside the dataset
    assert store.exists(claim)
    with pytest.raises(OutputExistsError, match="another writer"):
        atlas.Writer(where, append=True)
    with pytest.raises(OutputExistsError):
        lmdata.writer(where, "atlas", overwrite=True)
    assert len(lmdata.open(where)) == 6  # readers still see the previous dataset
    w.close()
    assert not store.exists(claim)
    assert len(lmdata.open(where)) == 7
