"""MDS validate on S3: one listing per directory, then one GET per shard file, whole (the
checks need every byte: hashes, offsets, every sample); no HEAD or existence probe per file."""

from __future__ import annotations

import pytest

import lmdata
from lmdata.storage import resolve


@pytest.mark.parametrize("cached", [True, False])  # s3fs's listings cache on or off
@pytest.mark.parametrize(
    ("fmt", "compression"), [("mds", None), ("mds", "zstd"), ("mds-csv", None)]
)
def test_validate_reads_each_shard_file_once(
    s3_root,
    requests,
    fmt,
    compression,
    cached,
):
    url = f"{s3_root}/d"
    cols = {"id": "int", "text": "str"}
    with lmdata.writer(url, fmt, columns=cols, size_limit=300, compression=compression) as w:
        for i in range(60):
            w.write({"id": i, "text": "z" * 40})
    r = lmdata.open(url)
    infos = [f for s in r.shards for f in (s.zip_data or s.raw_data, s.zip_meta or s.raw_meta)]
    files = [r.index.file(f).split("/", 1)[1] for f in infos if f is not None]  # no bucket
    assert len(r.shards) >= 8
    resolve(s3_root)[0].exists("x")  # another store of this process empties s3fs's listings cache
    requests.clear()
    opts = {} if cached else {"use_listings_cache": False}
    assert lmdata.validate(url, format="mds", storage_options=opts) == []
    gets = [k for meth, k in requests if meth == "get_object"]
    shard_gets = [k for k in gets if not k.endswith(("index.json", "lmdata-manifest"))]
    assert sorted(shard_gets) == sorted(files)  # each shard file once, whole
    others = [(m, k) for m, k in requests if m != "get_object"]
    assert all(m in ("list_objects_v2", "head_object") for m, _ in others), others
    # finding and reading index.json and one listing (and the manifest's: one more), a few
    # requests, none per shard
    assert not [k for _, k in others if "shard." in k] and len(others) <= 9, others
