"""Staging areas: where they go, parts written whole, units done, cleared after the job."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path

import pytest

from lmdata.errors import InvalidInputError
from lmdata.parallel.staging import LocalStaging, StoreStaging, prepare, staging_for
from lmdata.storage import FsspecStore


def test_staging_goes_beside_the_output(tmp_path: Path) -> None:
    assert staging_for(tmp_path / "o", None) == LocalStaging(str(tmp_path / ".o.lmdata-work"))
    s3 = staging_for("s3://bucket/runs/tok.zarr", {"anon": True})
    assert isinstance(s3, StoreStaging) and s3.key == "bucket/runs/.tok.zarr.lmdata-work"
    assert s3.where == "s3://bucket/runs/.tok.zarr.lmdata-work"
    assert isinstance(staging_for("memory://b/o", None), LocalStaging)  # one process only


@pytest.fixture(params=["local", "store"])
def staging(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "local":
        yield LocalStaging(str(tmp_path / ".o.lmdata-work"))
        return
    store = FsspecStore("memory")
    key = f"/staging-{uuid.uuid4().hex[:8]}/.o.lmdata-work"
    yield StoreStaging(store, key)
    store.remove(key.rsplit("/", 1)[0])


def test_parts_done_units_and_clear(staging) -> None:
    assert not staging.exists() and staging.manifest() is None
    staging.reset(b'{"job": 1}')
    assert staging.exists() and staging.manifest() == b'{"job": 1}'
    copy = pickle.loads(pickle.dumps(staging))  # what a worker receives
    copy.write_part("000001-000000-000000.npz", b"b")
    copy.write_part("000000-000002-000000.npz", b"x")
    copy.write_part("000000-000002-000000.npz", b"a")  # a retry replaces the part whole
    assert staging.parts() == ["000000-000002-000000.npz", "000001-000000-000000.npz"]
    assert staging.read_part("000000-000002-000000.npz") == b"a"
    staging.mark_done(0, 2)
    staging.mark_done(1, 0)
    assert staging.done() == {(0, 2), (1, 0)}
    staging.remove_part("000001-000000-000000.npz")
    assert staging.parts() == ["000000-000002-000000.npz"]
    staging.reset(b"new")  # a new job starts empty
    assert staging.parts() == [] and staging.done() == set()
    staging.clear()
    assert not staging.exists()


def test_a_torn_last_done_line_is_not_done(tmp_path: Path) -> None:
    s = LocalStaging(str(tmp_path / "w"))
    s.reset(b"m")
    s.mark_done(0, 0)
    with open(tmp_path / "w" / "done.log", "a") as f:
        f.write("000000-000001")  # killed before the newline
    assert s.done() == {(0, 0)}


def test_an_area_killed_before_its_manifest_is_no_job(tmp_path: Path) -> None:
    (tmp_path / "w" / "parts").mkdir(parents=True)  # reset was killed before the manifest
    s = LocalStaging(str(tmp_path / "w"))
    assert not s.exists()  # so --resume starts afresh instead of refusing a changed job
    s.reset(b"m")
    assert s.exists() and s.manifest() == b"m"


def test_manifests_keep_no_secrets_and_resume_across_a_rotated_key(tmp_path: Path) -> None:
    def manifest(secret: str, column: str = "tokens") -> bytes:
        job = {
            "source": "s3://AKIAFAKE:pw-in-url@bucket/src",
            "reader_options": {
                "token_column": column,
                "storage_options": {"key": "AKIAFAKE", "secret": secret, "anon": False},
            },
        }
        return json.dumps({"job": job}).encode()

    work = LocalStaging(str(tmp_path / "w"))
    prepare(work, manifest("first-secret"), False)
    kept = work.manifest()
    for secret in (b"AKIAFAKE", b"first-secret", b"pw-in-url"):
        assert secret not in kept
    assert json.loads(kept)["job"]["reader_options"]["token_column"] == "tokens"
    assert prepare(work, manifest("rotated-secret"), True) == set()  # only a credential changed
    with pytest.raises(InvalidInputError, match="token_column"):
        prepare(work, manifest("first-secret", column="ids"), True)
