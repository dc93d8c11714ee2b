"""Commits on S3 (the loopback moto server): a writer SIGKILLed at any request of an upload
leaves the previous dataset or nothing a reader accepts; two writers cannot both commit.

The kill points are chosen from the request log of one complete write (before the first data
object, mid data, between the last data object and the commit objects, inside the commit,
after it) rather than spread evenly, and every writer is a fork of one prepared process (no
interpreter start and import per point), so the whole set runs in seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lmdata
from lmdata.errors import LmdataError, OutputExistsError
from lmdata.storage import resolve

# Reads one JSON command per line: {"fmt", "url", "kill", "log"}. For each it forks a writer
# that writes the "new" dataset to url (overwriting) and SIGKILLs itself at its kill-th S3
# request (counting every request s3fs sends; 0: never), logging (method, key) of each request
# it sent to the file "log"; then answers with the writer's wait status.
SERVER = textwrap.dedent(
    """
    import json, os, signal, sys, traceback
    import numpy as np
    import s3fs.core
    from fsspec.asyn import sync_wrapper
    import lmdata

    ORIG = s3fs.core.S3FileSystem._call_s3
    N = NEW

    def write(fmt, url):
        if fmt == "flat-tokens":
            with lmdata.writer(url, fmt, overwrite=True, chunk_tokens=16) as w:
                for i in range(N):
                    w.write(np.full(i + 1, 7, dtype=np.int64))
        else:
            with lmdata.writer(url, fmt, overwrite=True, size_limit=200) as w:
                for i in range(N):
                    w.write({"id": i, "text": "new " * (i % 9)})

    def child(cmd):
        sent = []

        async def counted(self, method, *a, **kw):
            if len(sent) + 1 == cmd["kill"]:
                os.kill(os.getpid(), signal.SIGKILL)
            sent.append((method, kw.get("Key", "")))
            return await ORIG(self, method, *a, **kw)

        s3fs.core.S3FileSystem._call_s3 = counted
        s3fs.core.S3FileSystem.call_s3 = sync_wrapper(counted)  # what file objects call
        try:
            write(cmd["fmt"], cmd["url"])
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        with open(cmd["log"], "w") as f:
            json.dump(sent, f)
        os._exit(0)

    for line in sys.stdin:
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(cmd)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
                          "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1}),
              flush=True)
    """
)

OLD, NEW = 10, 14  # records in the old and the new dataset
SERVER = SERVER.replace("N = NEW", f"N = {NEW}")
META = {"index.json", ".zarray", ".zgroup", ".zattrs", "zarr.json"}  # the commit objects
MANIFEST = "lmdata-manifest"  # written after them (a kill before it: a dataset without one)
WRITES = {"put_object", "create_multipart_upload", "upload_part", "complete_multipart_upload"}


@pytest.fixture(scope="module")
def writers(s3_server, tmp_path_factory):
    """A prepared process that forks one killable writer per call: ``run(fmt, url, kill)``
    returns (wait status, request log of a finished write)."""
    err = tmp_path_factory.mktemp("killer") / "stderr"
    with open(err, "w") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errf,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
    log = tmp_path_factory.mktemp("killer") / "log.json"

    def run(fmt, url, kill):
        proc.stdin.write(json.dumps({"fmt": fmt, "url": url, "kill": kill, "log": str(log)}))
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, err.read_text()
        status = json.loads(line)
        sent = json.loads(log.read_text()) if kill == 0 else None
        return status, sent, err.read_text()

    yield run
    proc.stdin.close()
    proc.wait(timeout=60)


def _old(fmt, url):
    if fmt == "flat-tokens":
        with lmdata.writer(url, fmt, chunk_tokens=16) as w:
            for i in range(OLD):
                w.write(np.arange(i + 1))
    else:
        with lmdata.writer(url, fmt, size_limit=200) as w:
            for i in range(OLD):
                w.write({"id": i, "text": "old " * (i % 5)})


def _state(fmt, url):
    """'old', 'new', or 'none' (nothing opens); a readable mix of both fails the test."""
    try:
        r = lmdata.open(url, format=fmt)
    except LmdataError:
        return "none"
    assert lmdata.validate(url, format=fmt) == []
    if fmt == "flat-tokens":
        got = [x.tolist() for x in r]
        if got == [list(range(i + 1)) for i in range(OLD)]:
            return "old"
        assert got == [[7] * (i + 1) for i in range(NEW)]
    else:
        got = [x["text"] for x in r]
        if got == ["old " * (i % 5) for i in range(OLD)]:
            return "old"
        assert got == ["new " * (i % 9) for i in range(NEW)]
    return "new"


def _stages(sent):
    """Indices into a request log: data object writes, commit object writes, deletes."""
    name = [os.path.basename(k) for _, k in sent]
    data = [i for i, (m, _) in enumerate(sent) if m in WRITES and name[i] not in (*META, MANIFEST)]
    meta = [i for i, (m, _) in enumerate(sent) if m == "put_object" and name[i] in META]
    last = [i for i, (m, _) in enumerate(sent) if m == "put_object" and name[i] == MANIFEST]
    assert last and last[0] > meta[-1]  # the manifest after the commit objects
    deletes = [i for i, (m, _) in enumerate(sent) if m.startswith("delete")]
    assert len(data) >= 4 and meta and data[-1] < meta[0]  # data first, the commit last
    return data, meta, deletes


def _replace_points(sent):
    """{request number: what the store must hold after a kill there} for a write replacing a
    dataset, read off the request log of a complete one (numbers from 1: that request is not
    sent, the ones before it are)."""
    data, meta, deletes = _stages(sent)
    gone = next(i for i in deletes if i > data[-1])  # the old metadata's first delete
    copy = next(i for i, (m, _) in enumerate(sent) if m == "copy_object")
    assert data[-1] < gone < copy < meta[0]
    return {
        data[0] + 1: "old",  # before the first data object
        data[len(data) // 2] + 1: "old",  # mid data
        data[-1] + 2: "old",  # between the last data object and the commit
        gone + 2: "none",  # the old dataset invalid, nothing new yet
        copy + 2: "none",  # staged objects being moved into place
        meta[0] + 1: "none",  # everything in place but the commit objects
        meta[-1] + 1: "none",  # all commit objects but the last (flat-tokens has several)
        meta[-1] + 2: "new",  # committed, the staged objects not yet removed
    }


@pytest.mark.parametrize("fmt", ["mds", "flat-tokens"])
def test_writer_killed_at_any_stage_leaves_old_or_nothing(s3_root, writers, fmt):
    store, root = resolve(s3_root)
    probe = f"{s3_root}/probe"
    status, fresh, err = writers(fmt, probe, 0)  # to a new URL
    assert status == {"signal": 0, "code": 0}, err
    status, sent, err = writers(fmt, probe, 0)  # replacing that dataset
    assert status == {"signal": 0, "code": 0}, err
    assert _state(fmt, probe) == "new"

    data, meta, _ = _stages(fresh)  # new URL: a kill leaves objects no reader accepts
    for kill in (data[len(data) // 2] + 1, meta[-1] + 1):
        url = f"{s3_root}/new-{kill}"
        status, _, err = writers(fmt, url, kill)
        assert status["signal"] == signal.SIGKILL, (kill, err)
        assert _state(fmt, url) == "none"
        assert store.exists(f"{root}/new-{kill}/.lmdata-writing")  # the dead writer's claim
        with pytest.raises(OutputExistsError, match="lmdata clean"):
            lmdata.writer(url, fmt, overwrite=True)  # names the way out

    pristine, url = f"{root}/old", f"{s3_root}/ds"
    _old(fmt, f"{s3_root}/old")
    store.fs.copy(pristine, f"{root}/ds", recursive=True)
    points = _replace_points(sent)
    assert len(points) >= 7
    seen = {}
    for kill in sorted(points):
        status, _, err = writers(fmt, url, kill)
        assert status["signal"] == signal.SIGKILL, (kill, err)
        seen[kill] = _state(fmt, url)
        if seen[kill] != "old":  # start the next point from the old dataset again
            store.remove(f"{root}/ds")
            store.fs.copy(pristine, f"{root}/ds", recursive=True)
    assert seen == points  # each stage left exactly what it must (mid-commit: nothing)


def test_a_second_writer_to_a_new_url_is_refused_at_once(s3_root):
    url = f"{s3_root}/race"
    a = lmdata.writer(url, "mds")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="another writer is writing"):
            lmdata.writer(url, "mds", overwrite=overwrite)
    a.write({"id": 1})
    a.close()
    assert [x["id"] for x in lmdata.open(url)] == [1]
    store, key = resolve(url)
    assert ".lmdata-writing" not in store.list(key)  # commit gave the claim up
    with pytest.raises(OutputExistsError, match="already exists"):
        lmdata.writer(url, "mds")


def test_two_writers_cannot_both_commit(s3_root):
    """Writers that both got past the claim (it was removed under the first, as a careless
    clean would) are still told apart by the conditional commit: the first to commit wins."""
    url = f"{s3_root}/race2"
    a = lmdata.writer(url, "mds")
    store, key = resolve(url)
    store.remove(key)  # a's claim
    b = lmdata.writer(url, "mds")
    a.write({"id": 1})
    b.write({"id": 2})
    a.close()
    with pytest.raises(OutputExistsError, match="another writer"):
        b.close()
    assert [x["id"] for x in lmdata.open(url)] == [1]  # a's dataset, not b's


def test_abort_gives_the_claim_up(s3_root):
    url = f"{s3_root}/ab"
    w = lmdata.writer(url, "mds")
    w.write({"id": 1})
    w.abort()
    store, key = resolve(url)
    assert not store.exists(key)
    with lmdata.writer(url, "mds") as w2:  # free again
        w2.write({"id": 2})
    assert [x["id"] for x in lmdata.open(url)] == [2]


def test_overwrite_keeps_the_old_dataset_readable_until_commit(s3_root):
    url = f"{s3_root}/ow"
    _old("mds", url)
    w = lmdata.writer(url, "mds", overwrite=True, size_limit=200)
    for i in range(NEW):
        w.write({"id": i, "text": "new " * (i % 9)})
    assert _state("mds", url) == "old"  # new objects are staged under a .lmdata-tmp- name
    store, key = resolve(url)
    parent = key.rsplit("/", 1)[0]
    assert any(n.startswith(".lmdata-tmp-ow-") for n in store.list(parent))
    w.close()
    assert _state("mds", url) == "new"
    fresh = resolve(url)[0]  # a new listing (s3fs caches the one above)
    assert not any(n.startswith(".lmdata-tmp-") for n in fresh.list(parent))
