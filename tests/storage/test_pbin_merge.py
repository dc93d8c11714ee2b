"""`.pbin` merge on local paths, memory:// and S3 (moto): the same bytes as the local merge
wherever inputs and output live, the output claimed first and appearing whole or not at all."""

from __future__ import annotations

import importlib
import shutil

import numpy as np
import pytest

import lmdata
from lmdata._api import merge
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats.modalities import merge as pbin_merge
from lmdata.storage import resolve

DOCS = {  # name -> (documents, token width)
    "a.pbin": ([[1, 2, 3], [4], []], 2),
    "b.pbin": ([[7, 8], [9, 10, 11, 12]], 1),
    "sub/c.pbin": ([[70000, 5]], 4),
}


def _inputs(root: str) -> str:
    for name, (docs, width) in DOCS.items():
        with lmdata.writer(f"{root}/parts/{name}", "modalities", token_width=width) as w:
            for d in docs:
                w.write(np.array(d, dtype=np.int64))
    return f"{root}/parts"


def _bytes(url: str) -> bytes:
    store, key = resolve(url)
    return store.read(key)


@pytest.fixture
def local_merged(tmp_path):
    parts = _inputs(str(tmp_path / "local"))
    out = str(tmp_path / "local" / "m.pbin")
    merge([parts], out, format="modalities")
    return _bytes(out)


def test_merge_on_a_store_gives_the_local_bytes(where, tmp_path, local_merged):
    parts = _inputs(where)
    out = f"{where}/m.pbin"
    msg = merge([parts], out, format="modalities")
    assert (msg.inputs, msg.records) == (3, 6)
    assert _bytes(out) == local_merged
    r = lmdata.open(out)
    want = [d for docs, _ in DOCS.values() for d in docs]
    assert [x.tolist() for x in r] == want
    assert lmdata.validate(out) == []
    store, key = resolve(where)
    # no claim or temporary object left; the merged file's manifest beside it
    assert sorted(store.list(key)) == ["m.pbin", "m.pbin.lmdata-manifest", "parts"]


def test_inputs_and_output_on_different_stores(memory_root, tmp_path, local_merged):
    parts = _inputs(memory_root)
    files = [f"{parts}/a.pbin", f"{parts}/b.pbin", f"{parts}/sub/c.pbin"]
    local_out = str(tmp_path / "from-memory.pbin")
    pbin_merge(files, local_out)
    assert _bytes(local_out) == local_merged
    local_parts = _inputs(str(tmp_path / "again"))
    pbin_merge([local_parts], f"{memory_root}/from-local.pbin")
    assert _bytes(f"{memory_root}/from-local.pbin") == local_merged


def test_existing_output_self_and_empty_directory_on_a_store(memory_root):
    parts = _inputs(memory_root)
    a = f"{parts}/a.pbin"
    b = f"{parts}/b.pbin"
    with pytest.raises(OutputExistsError):
        pbin_merge([a], b)
    with pytest.raises(InvalidInputError, match="also an input"):
        pbin_merge([a, b], b, overwrite=True)
    before = _bytes(b)
    pbin_merge([a], b + ".x")
    pbin_merge([a, a], b + ".x", overwrite=True)
    assert _bytes(b + ".x") != _bytes(a) and _bytes(b) == before
    store, key = resolve(f"{memory_root}/nothing/x.txt")
    store.put(key, b"not a pbin")
    with pytest.raises(InvalidInputError, match=r"no \.pbin"):
        pbin_merge([f"{memory_root}/nothing"], f"{memory_root}/o.pbin")


def test_a_failed_merge_leaves_nothing_and_no_claim(memory_root, monkeypatch):
    parts = _inputs(memory_root)
    m = importlib.import_module("lmdata.formats.modalities.merge")  # (merge is also a function)

    def broken(readers, f, *_):
        f.write(b"partial")
        raise OSError("disk gone")

    monkeypatch.setattr(m, "_write", broken)
    with pytest.raises(OSError, match="disk gone"):
        pbin_merge([parts], f"{memory_root}/out.pbin")
    store, key = resolve(memory_root)
    assert sorted(store.list(key)) == ["parts"]  # no output, no claim


def test_on_s3_the_claim_comes_first_and_goes_last(s3_root, monkeypatch, local_merged):
    parts = _inputs(s3_root)
    m = importlib.import_module("lmdata.storage.spool")
    store, root = resolve(s3_root)
    claim, dest = f"{root}/.lmdata-writing-m.pbin", f"{root}/m.pbin"
    seen = {}

    copy = shutil.copyfileobj

    def upload(src, dst, n):  # the moment the merged bytes go to the store
        seen.update(claimed=store.exists(claim), dest=store.exists(dest))
        copy(src, dst, n)

    monkeypatch.setattr(m.shutil, "copyfileobj", upload)
    merge([parts], f"{s3_root}/m.pbin", format="modalities")
    assert seen == {"claimed": True, "dest": False}  # claimed first, nothing at the URL yet
    assert not store.exists(claim) and _bytes(f"{s3_root}/m.pbin") == local_merged
    with pytest.raises(OutputExistsError):  # a second merge to the URL is refused
        merge([parts], f"{s3_root}/m.pbin", format="modalities")
