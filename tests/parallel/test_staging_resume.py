"""Resuming from a staging area: the manifest check that names what changed, the parts kept and
dropped, and the version of a source file or folder (local or on a store)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from lmdata.errors import InvalidInputError
from lmdata.parallel.staging import LocalStaging, manifest_changes, prepare, tree_version
from lmdata.storage import FsspecStore, options_scope


def _manifest(**job) -> bytes:
    return json.dumps({"job": {"to": "mds", **job}, "source": {"digest": "a"}}).encode()


def test_prepare_starts_resumes_and_refuses(tmp_path: Path) -> None:
    work = LocalStaging(str(tmp_path / ".o.lmdata-convert"))
    assert prepare(work, _manifest(), resume=True, job="convert") == set()  # nothing to resume
    assert work.manifest() == _manifest()
    for name in (
        "000000-000000-000000.rec",
        "000000-000001-000000.rec",
        "000000-000002-000000.rec",
    ):
        work.write_part(name, b"x")
    Path(work.path, "parts", ".000000-000003-000000.rec.1.tmp").write_bytes(b"torn")
    work.mark_done(0, 0)
    work.mark_done(0, 1)
    with pytest.raises(InvalidInputError, match=r"cannot resume: job\.to differs from the inter"):
        prepare(work, _manifest(to="jsonl"), resume=True, job="convert")
    assert len(work.parts()) == 4  # refused: untouched
    assert prepare(work, _manifest(), resume=True) == {(0, 0), (0, 1)}
    assert work.parts() == ["000000-000000-000000.rec", "000000-000001-000000.rec"]
    assert prepare(work, _manifest(), resume=False) == set()  # a new job empties the area
    assert work.parts() == [] and work.done() == set()


def test_a_manifest_that_is_no_json_object_differs_without_names(tmp_path: Path) -> None:
    work = LocalStaging(str(tmp_path / "w"))
    work.reset(b"convert")  # what lmdata before resume wrote
    with pytest.raises(InvalidInputError, match="the inputs or options differ"):
        prepare(work, _manifest(), resume=True)


def test_manifest_changes_names_each_leaf() -> None:
    old = json.dumps({"job": {"a": 1, "b": [1, 2]}, "source": {"size": 3, "digest": "x"}})
    new = json.dumps(
        {"job": {"a": 1, "b": [1, 3], "c": None}, "source": {"size": 4, "digest": "x"}}
    )
    assert manifest_changes(old.encode(), new.encode()) == ["job.b", "source.size"]
    assert manifest_changes(None, new.encode()) == []
    assert manifest_changes(b"[1]", b"[2]") == []


def test_tree_version_of_a_local_folder_and_file(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a").write_bytes(b"12345")
    (tmp_path / "d" / "sub" / ".zarray").write_bytes(b"{}")  # hidden files are data too
    v = tree_version(tmp_path / "d")
    assert (v["size"], v["files"]) == (7, 2)
    assert tree_version(tmp_path / "d") == v
    st = (tmp_path / "d" / "sub" / ".zarray").stat()
    os.utime(tmp_path / "d" / "sub" / ".zarray", ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert tree_version(tmp_path / "d")["digest"] != v["digest"]  # touched: another version
    f = tree_version(tmp_path / "d" / "a")
    assert (f["size"], f["files"]) == (5, 1)


def test_tree_version_on_a_store() -> None:
    store = FsspecStore("memory")
    root = f"/tv-{uuid.uuid4().hex[:8]}"
    try:
        store.put(f"{root}/ds/x.bin", b"abc")
        store.put(f"{root}/ds/y/z.bin", b"defg")
        with options_scope(None):
            v = tree_version(f"memory://{root}/ds")
            assert (v["size"], v["files"]) == (7, 2)
            assert tree_version(f"memory://{root}/ds/x.bin")["size"] == 3
            store.put(f"{root}/ds/x.bin", b"abd")  # same size, written again
            assert tree_version(f"memory://{root}/ds")["digest"] != v["digest"]
    finally:
        store.remove(root)
