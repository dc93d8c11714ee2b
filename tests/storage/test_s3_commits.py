"""Commits on S3 (the loopback moto server) under real SIGKILLs: a writer killed right after
one of its mutating requests leaves the old dataset, the new one, or nothing a reader accepts;
after `lmdata clean --claims` a replaced dataset is the old or the new one (a commit under way
is finished from its journal), and nothing of the writer is left. The kill points are some of
those tests/storage/test_faults_writes.py stops writers at in-process, so the two agree; every
writer is a fork of one prepared process (no interpreter start and import per point). Two
writers to one URL cannot both commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import lmdata
from lmdata.errors import OutputExistsError
from lmdata.storage import clean, resolve
from lmdata.storage.claims import claim_key

from ._faults import points, read, write

# Reads one JSON command per line: {"fmt", "url", "kill", "overwrite"}. For each it forks a
# writer of the "new" dataset that SIGKILLs itself right after its kill-th mutating S3 request;
# then answers with the writer's wait status.
SERVER = textwrap.dedent(
    """
    import json, os, signal, sys, traceback
    import s3fs.core
    from fsspec.asyn import sync_wrapper
    sys.path.insert(0, os.getcwd())
    from tests.storage._faults import MUTATING, write

    ORIG = s3fs.core.S3FileSystem._call_s3

    def child(cmd):
        sent = [0]

        async def counted(self, method, *a, **kw):
            out = await ORIG(self, method, *a, **kw)
            if method in MUTATING:
                sent[0] += 1
                if sent[0] == cmd["kill"]:
                    os.kill(os.getpid(), signal.SIGKILL)
            return out

        s3fs.core.S3FileSystem._call_s3 = counted
        s3fs.core.S3FileSystem.call_s3 = sync_wrapper(counted)  # what file objects call
        try:
            write(cmd["fmt"], cmd["url"], "new", cmd["n"], overwrite=cmd["overwrite"])
        except BaseException:
            traceback.print_exc()
            os._exit(1)
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

OLD, NEW = 5, 7  # records in the old and the new dataset


@pytest.fixture(scope="module")
def writers(s3_server, tmp_path_factory):
    """A prepared process that forks one killable writer per call: ``run(fmt, url, kill,
    overwrite)`` returns its wait status."""
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

    def run(fmt, url, kill, overwrite):
        cmd = {"fmt": fmt, "url": url, "kill": kill, "overwrite": overwrite, "n": NEW}
        proc.stdin.write(json.dumps(cmd) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, err.read_text()
        return json.loads(line), err.read_text()

    yield run
    proc.stdin.close()
    proc.wait(timeout=60)


@pytest.mark.parametrize("fmt", ["dolma", "mds"])
def test_writer_killed_mid_write_or_commit_leaves_old_or_new(s3_root, writers, fmt):
    from ._faults import stop_after
    from .test_faults_writes import _journal

    store, root = resolve(s3_root)
    with stop_after(None) as fresh:
        write(fmt, f"{s3_root}/new", "new", NEW)
    write(fmt, f"{s3_root}/old", "old", OLD)
    new, old = read(fmt, f"{s3_root}/new"), read(fmt, f"{s3_root}/old")
    store.fs.copy(f"{root}/old", f"{root}/probe", recursive=True)
    with stop_after(None) as replacing:
        write(fmt, f"{s3_root}/probe", "new", NEW, overwrite=True)
    seen = {}
    j = _journal(replacing.log)
    for kind, log, budget in (("n", fresh.log, 1), ("r", replacing.log, 2)):
        for k in sorted({*points(log, budget), *([j] if kind == "r" else [])}):
            url = f"{s3_root}/{kind}{k}"
            if kind == "r":
                store.fs.copy(f"{root}/old", f"{root}/{kind}{k}", recursive=True)
            status, err = writers(fmt, url, k, kind == "r")
            assert status["signal"] == 9, (kind, k, err)
            seen[kind, k] = read(fmt, url, validate=True)
            assert seen[kind, k] in ((None, new) if kind == "n" else (None, old, new)), (kind, k)
    # the next writer finishes the commit a killed one left (then finds the dataset there)
    with pytest.raises(OutputExistsError, match="already exists"):
        lmdata.writer(f"{s3_root}/r{j}", fmt)
    assert read(fmt, f"{s3_root}/r{j}") == new
    clean(s3_root, claims=True)  # and lmdata clean the others
    store.fs.invalidate_cache()
    assert [k for k in store.fs.find(root) if ".lmdata-" in k] == []
    for (kind, k), before in seen.items():
        after = read(fmt, f"{s3_root}/{kind}{k}")
        if kind == "n":
            assert after in (None, new) and (before is None or after == new), (kind, k)
        else:
            assert after == (new if k >= j else old), (kind, k)


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
    store.remove(claim_key(key))  # a's claim
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
    write("mds", url, "old", OLD)
    old = read("mds", url)
    w = lmdata.writer(url, "mds", overwrite=True, size_limit=200)
    for i in range(NEW):
        w.write({"id": i, "text": "new " * (i % 9)})
    assert read("mds", url) == old  # new objects are staged under a .lmdata-tmp- name
    store, key = resolve(url)
    parent = key.rsplit("/", 1)[0]
    assert any(n.startswith(".lmdata-tmp-ow-") for n in store.list(parent))
    w.close()
    assert [x["id"] for x in read("mds", url)] == list(range(NEW))
    fresh = resolve(url)[0]  # a new listing (s3fs caches the one above)
    assert not any(n.startswith(".lmdata-tmp-") for n in fresh.list(parent))


@pytest.mark.parametrize("fmt", ["mds", "dolma"])
def test_a_commit_whose_claim_stays_succeeds_and_the_next_writer_knows_it(
    s3_root, monkeypatch, fmt
):
    """Removing the claim after a commit fails (a store's hiccup): the dataset is committed, so
    the writer warns rather than fails; the claim left is known for a finished write's, by the
    next writer and by `lmdata clean`, and blocks nobody."""
    from lmdata.storage import FsspecStore

    url = f"{s3_root}/c"
    remove = FsspecStore.remove

    def failing(self, key):
        if ".lmdata-writing" in key:
            raise OSError("SlowDown: please reduce your request rate")
        return remove(self, key)

    monkeypatch.setattr(FsspecStore, "remove", failing)
    with pytest.warns(UserWarning, match="committed, but removing"):
        write(fmt, url, "old", OLD)
    monkeypatch.undo()
    store, key = resolve(url)
    assert store.exists(claim_key(key)) and read(fmt, url) is not None
    with pytest.raises(OutputExistsError, match="already exists"):  # not "another writer"
        lmdata.writer(url, fmt)
    assert not store.exists(claim_key(key))
    write(fmt, url, "new", NEW, overwrite=True)
    assert len(read(fmt, url)) == NEW
