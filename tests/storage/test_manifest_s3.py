"""Opening a dataset on an object store checks it against its manifest for one request more
than opening it unchecked: the manifest's GET. The listing it compares is the one the reader
made anyway (counted where s3fs sends requests, on the loopback S3 server)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import lmdata
from lmdata.errors import CorruptDataError
from lmdata.storage import resolve
from lmdata.storage.manifest import is_manifest_name

FORMATS = {
    "flat-tokens": ("d", {"chunk_tokens": 64}),
    "mds": ("d", {"size_limit": 600}),
    "atlas": ("d", {"shard_size": 20}),
    "modalities": ("d.pbin", {"vocab_size": 1000}),
    "modalities-jsonl": ("d.jsonl", {}),
    "jsonl": ("d.jsonl", {}),
    "dolma": ("d", {"max_file_docs": 20}),
}
TOKENS = ("flat-tokens", "modalities")


@pytest.fixture
def requests(monkeypatch, s3_server):
    s3fs = pytest.importorskip("s3fs")
    log: list[tuple[str, str]] = []
    orig = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *a, **kw):
        log.append((method, kw.get("Key", kw.get("Prefix", ""))))
        return await orig(self, method, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return log


def _write(url: str, fmt: str) -> None:
    with lmdata.writer(url, fmt, **FORMATS[fmt][1]) as w:
        for i in range(70):
            if fmt in TOKENS:
                w.write(np.arange(i % 9 + 1, dtype=np.int64))
            else:
                w.write({"id": str(i), "text": "t" * (i % 13 + 1), "source": "s"})


def _opened(url: str, fmt: str, log: list, verify: bool) -> Counter:
    resolve(url)[0].fs.invalidate_cache()  # no listing of an earlier open serves this one
    log.clear()
    with lmdata.open(url, format=fmt, verify=verify) as r:
        assert len(r) == 70
    return Counter(log)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_check_on_open_costs_the_manifests_get_only(s3_root, requests, fmt):
    url = f"{s3_root}/{FORMATS[fmt][0]}"
    _write(url, fmt)
    checked = _opened(url, fmt, requests, True)
    unchecked = _opened(url, fmt, requests, False)
    extra = list((checked - unchecked).elements())
    assert len(extra) == 1 and extra[0][0] == "get_object", extra  # no HEAD, no listing
    assert is_manifest_name(extra[0][1].rsplit("/", 1)[-1]), extra
    assert not unchecked - checked, "the check spared a request the reader makes"


@pytest.mark.parametrize("fmt", ["mds", "modalities"])
def test_a_damaged_dataset_on_s3_is_refused_on_open_and_read_with_verify_false(s3_root, fmt):
    url = f"{s3_root}/{FORMATS[fmt][0]}"
    _write(url, fmt)
    store, key = resolve(url)
    found = [k for k in store.fs.find(key) if not is_manifest_name(k.rsplit("/", 1)[-1])]
    victim = max(found, key=lambda k: store.fs.size(k))
    store.fs.pipe_file(victim, bytes(store.fs.cat_file(victim)) + b"\n")
    with pytest.raises(CorruptDataError, match="grown") as e:
        lmdata.open(url, format=fmt)
    assert e.value.path is not None and f"s3://{victim}" in str(e.value)
    with lmdata.open(url, format=fmt, verify=False) as r:
        assert len(r) == 70
