"""Dolma dedupe with its hash buckets on S3 (moto): the spill costs one PUT per worker's spill
and per bucket, and one ranged GET per (spill, bucket) and (worker group, bucket), not a PUT and
a GET per (file, bucket); the attribute files are those of a local run."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from lmdata.dolma import dedupe as dd
from lmdata.dolma.config import DedupeConfig
from lmdata.storage import resolve

DATA = Path(__file__).parent.parent / "data" / "dolma" / "dataset" / "documents"
FILES = [f"part-{i}.jsonl.gz" for i in range(8)]  # the two fixture parts, four times each
MODE = {"paragraphs": {"attribute_name": "p"}}


def _run(docs: str, **kw) -> dd.DedupeResult:
    cfg = DedupeConfig.from_dict({"documents": [docs], "dedupe": {"name": "d", **MODE}, **kw})
    return dd.dedupe(cfg, engine="inprocess")


def test_spill_requests_grow_with_buckets_plus_files_not_their_product(
    tmp_path, s3_root, requests, monkeypatch
):
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 300)  # 83 KB of input: 16 buckets
    monkeypatch.setattr(dd, "GROUPS", 2)  # fewer groups than files: the point of the layout
    tasks: list = []
    mark = dd._phase_mark

    def counted(task):
        tasks.append(task)
        return mark(task)

    monkeypatch.setattr(dd, "_phase_mark", counted)
    local = tmp_path / "ds" / "documents"
    local.mkdir(parents=True)
    store, key = resolve(s3_root)
    for i, name in enumerate(FILES):
        data = (DATA / f"part-{i % 2}.jsonl.gz").read_bytes()
        (local / name).write_bytes(data)
        store.put(f"{key}/documents/{name}", data)
    _run(str(local), processes=2)
    tasks.clear()
    requests.clear()
    res = _run(f"{s3_root}/documents/*.gz", processes=2)
    nb, groups = len(tasks), dd.GROUPS
    assert nb >= 16 and res.duplicates > 0
    work = [(m, k) for m, k in requests if ".lmdata-tmp-dedupe-" in k]
    # each unit's done marker (for --resume) and the job's manifest: one small PUT per unit
    marks = Counter(m for m, k in work if "/done/" in k or k.endswith("manifest.json"))
    assert marks["put_object"] <= 1 + groups + nb + len(FILES)
    spill = Counter(m for m, k in work if "/done/" not in k and not k.endswith("manifest.json"))
    assert spill["put_object"] <= groups + nb  # one object per spill and per marked bucket
    assert spill["get_object"] <= 2 * groups * nb  # one range per (spill, bucket), (group, bucket)
    assert sum(spill.values()) < len(FILES) * nb  # the old layout sent 2-4 per (file, bucket)
    for name in FILES:
        got = store.read(f"{key}/attributes/d/{name}")
        assert got == (tmp_path / "ds" / "attributes" / "d" / name).read_bytes(), name
    assert sorted(store.list(key)) == ["attributes", "documents"]  # the spill removed
    shutil.rmtree(tmp_path / "ds")
