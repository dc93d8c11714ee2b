"""A URL is never a local folder: resolve, refusals, missing extras, file:// as a path."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import lmdata
from lmdata.errors import InvalidInputError, LmdataError, MissingDependencyError
from lmdata.storage import FsspecStore, LocalStore, check_output, local_path, resolve, scheme


def test_resolve_local_file_and_memory(tmp_path):
    store, key = resolve(tmp_path / "x")
    assert isinstance(store, LocalStore) and key == str(tmp_path / "x")
    store, key = resolve(f"file://{tmp_path}/x")
    assert isinstance(store, LocalStore) and key == f"{tmp_path}/x"
    store, key = resolve("memory://bucket/a/b/")
    assert isinstance(store, FsspecStore) and key == "/bucket/a/b"
    assert store.url(key) == "memory://bucket/a/b"


def test_plain_names_with_colons_stay_local():
    assert scheme("name:tag") is None and scheme("data/x:y.jsonl") is None
    assert scheme("S3://b") == "s3"


@pytest.mark.parametrize("url", ["foo://x/y", "s3:/bucket/x", "memory:/x"])
def test_unservable_or_mangled_urls_are_errors(url):
    with pytest.raises(InvalidInputError, match="URL"):
        resolve(url)


def test_a_file_url_without_an_absolute_path_is_never_another_local_file(tmp_path, monkeypatch):
    """``file:x.jsonl`` is no file URL (those hold absolute paths): it was read as the local
    file ``x.jsonl``, a differently named file, while ``file:x.jsonl`` itself sat there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file:x.jsonl").write_text('{"text": "mine"}\n')
    (tmp_path / "x.jsonl").write_text('{"text": "another file"}\n')
    for bad in ("file:x.jsonl", "file:data/x"):
        with pytest.raises(InvalidInputError, match="no file URL") as ei:
            resolve(bad)
        assert f"{tmp_path}/{bad}" in str(ei.value)  # the name that does work
    with pytest.raises(InvalidInputError, match="no file URL"):
        lmdata.open("file:x.jsonl")
    assert lmdata.open(f"{tmp_path}/file:x.jsonl")[0] == {"text": "mine"}
    assert lmdata.open("./file:x.jsonl")[0] == {"text": "mine"}
    # a local file whose name starts like a URL: the name the refusal gives works, and ./ too
    (tmp_path / "tar:1.jsonl").write_text('{"text": "tar"}\n')
    with pytest.raises(InvalidInputError, match=f"or {tmp_path}/tar:1.jsonl for a local"):
        lmdata.open("tar:1.jsonl")
    assert lmdata.open("./tar:1.jsonl")[0] == {"text": "tar"}  # (Path drops the ./)
    assert lmdata.info("./tar:1.jsonl")["format"] == "jsonl"
    assert resolve(f"file:{tmp_path}/x.jsonl")[1] == f"{tmp_path}/x.jsonl"  # file:/abs is one


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs is installed")
def test_missing_s3fs_names_the_extra():
    with pytest.raises(MissingDependencyError, match=r"lmdata\[s3\]"):
        lmdata.open("s3://bucket/data.zarr")


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_missing_gcsfs_names_the_extra():
    with pytest.raises(MissingDependencyError, match=r"lmdata\[gcs\]"):
        lmdata.info("gs://bucket/out.zarr")


def test_local_only_writers_refuse_urls_without_making_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from lmdata.formats.mds.merge import merge

    with pytest.raises(LmdataError, match=r"neither a dataset"):  # merged in the store
        merge(["memory://bucket/a"], "memory://bucket/x")
    with pytest.raises(InvalidInputError, match="local paths only"):
        check_output("memory://bucket/out.zarr", overwrite=False)
    assert os.listdir(tmp_path) == []


def test_tokenize_to_a_url_never_writes_a_local_s3_folder(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from lmdata.cli.main import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n')
    res = CliRunner().invoke(
        cli, ["tokenize", "in.jsonl", "memory://bucket/out.zarr", "--tokenizer", "bytes"]
    )
    assert res.exit_code != 0
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_file_urls_are_local_paths(tmp_path):
    with lmdata.writer(f"file://{tmp_path}/ds.zarr", "flat-tokens") as w:
        w.write(np.arange(5))
    assert (tmp_path / "ds.zarr" / ".zgroup").is_file()
    assert local_path(f"file://{tmp_path}/ds.zarr") == tmp_path / "ds.zarr"
    assert lmdata.open(f"file://{tmp_path}/ds.zarr")[0].tolist() == [0, 1, 2, 3, 4]


def test_dolma_serves_urls(memory_root):
    """Dolma, the last format that was local-only, reads and writes URLs now."""
    with lmdata.writer(f"{memory_root}/x", "dolma") as w:
        w.write({"id": "1", "text": "hi", "source": "s"})
    assert [d["text"] for d in lmdata.open(f"{memory_root}/x", format="dolma")] == ["hi"]
