"""Errors of the Atlas and JSONL readers on an object store name the object by its full URL
(``s3://bucket/...``), as a user would type it, never by its bare key."""

from __future__ import annotations

import pytest

import lmdata
from lmdata.errors import CorruptDataError, LmdataError
from lmdata.storage import resolve


def _write(url: str, fmt: str, n: int = 60, **kw) -> None:
    with lmdata.writer(url, fmt, **kw) as w:
        for i in range(n):
            w.write({"id": str(i), "text": "t" * (i % 9 + 1)})


def _put(url: str, data: bytes) -> None:
    store, key = resolve(url)
    store.put(key, data)


def _names_url(e: LmdataError, url: str) -> None:
    assert e.path is not None and e.path.startswith(url), (e.path, str(e))
    assert str(e).startswith("s3://"), str(e)


@pytest.mark.parametrize(
    ("name", "damage", "match"),
    [
        ("0/index.npy", None, "missing index.npy"),
        ("0/index.npy", b"\x93NUMPY junk", "cannot load index.npy"),
        ("0/meta.json", b'{"version": 1, "block_size": -3}', "block_size"),
        ("meta.json", b'{"version": 1, "shard_sizes": "x", "compression_strategy": 0}', "shard_"),
    ],
)
def test_atlas_errors_name_the_url(s3_root, name, damage, match):
    url = f"{s3_root}/atlas"
    _write(url, "atlas", shard_size=20)
    store, key = resolve(f"{url}/{name}")
    if damage is None:
        store.remove(key)
    else:
        store.put(key, damage)
    with pytest.raises(CorruptDataError, match="differs from its manifest") as ei:
        lmdata.open(url, format="atlas")  # the manifest's check comes first
    _names_url(ei.value, f"{url}/{name}")
    with pytest.raises(LmdataError, match=match) as ei:  # then the reader's own (salvage)
        r = lmdata.open(url, format="atlas", verify=False)
        [r[i] for i in range(len(r))]
    _names_url(ei.value, f"{url}/{name}")


def test_jsonl_errors_name_the_url(s3_root):
    url = f"{s3_root}/d.jsonl"
    _put(url, b'{"a": 1}\n{"a": 2\n{"a": 3}\n')
    with pytest.raises(CorruptDataError, match="line 2") as ei:
        lmdata.open(url, format="jsonl")[1]
    _names_url(ei.value, url)
    assert any(p.startswith(url) or url in p for p in lmdata.validate(url, format="jsonl"))


def test_modalities_jsonl_errors_name_the_url(s3_root):
    url = f"{s3_root}/m.jsonl"
    _write(url, "modalities-jsonl", 30, manifest=False)  # the reader's own checks
    store, key = resolve(url)
    data = store.read(key)
    _put(url, data[: len(data) // 2])  # the index now points past the end of the data
    with pytest.raises(CorruptDataError, match="rebuild") as ei:
        lmdata.open(url, format="modalities-jsonl")
    _names_url(ei.value, f"{s3_root}/m.idx")
    assert f"lmdata index --overwrite {url}" in str(ei.value)
    problems = lmdata.validate(url, format="modalities-jsonl")
    assert problems and all("s3://" in p or "m.idx" in p for p in problems)


def test_atlas_validate_names_the_url(s3_root):
    """validate's own findings (not only the reader's errors) name objects by URL."""
    url = f"{s3_root}/atlas-v"
    _write(url, "atlas", shard_size=20)
    store, key = resolve(f"{url}/0/index.npy")
    _put(f"{url}/0/index.npy", store.read(key) + b"junk")  # bytes after the array
    store, key = resolve(f"{url}/0/meta.json")
    meta = store.read(key)
    _put(f"{url}/0/meta.json", meta[:-1] + b', "extra": 1}')  # a key the origin refuses
    problems = lmdata.validate(url, format="atlas")
    assert len(problems) == 4, problems  # the manifest's findings, then the format's
    assert any(p.startswith(f"{url}/0/index.npy: grown") for p in problems), problems
    assert any(p.startswith(f"{url}/0/meta.json: grown") for p in problems), problems
    assert any(p.startswith(f"{url}/0/index.npy: 4 bytes follow") for p in problems), problems
    assert any(p.startswith(f"{url}/0/meta.json: extra keys") for p in problems), problems
