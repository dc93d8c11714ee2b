"""Commits on S3 (the loopback moto server): a writer SIGKILLed at any request of an upload
leaves the previous dataset or nothing a reader accepts; two writers cannot both commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lmdata
from lmdata.errors import LmdataError, OutputExistsError

# The child overwrites the dataset at URL and SIGKILLs itself at its KILL-th S3 request
# (counting every request s3fs sends); with KILL=0 it finishes and prints how many it sent.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import s3fs.core
    import lmdata

    fmt, url, kill = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls = [0]
    orig = s3fs.core.S3FileSystem._call_s3

    async def counted(self, method, *a, **kw):
        calls[0] += 1
        if calls[0] == kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return await orig(self, method, *a, **kw)

    s3fs.core.S3FileSystem._call_s3 = counted
    if fmt == "flat-tokens":
        with lmdata.writer(url, fmt, overwrite=True, chunk_tokens=64) as w:
            for i in range(40):
                w.write(np.full(i + 1, 7, dtype=np.int64))
    else:
        with lmdata.writer(url, fmt, overwrite=True, size_limit=400) as w:
            for i in range(40):
                w.write({"id": i, "text": "new " * (i % 9)})
    print(calls[0])
    """
)


def _old(fmt, url):
    if fmt == "flat-tokens":
        with lmdata.writer(url, fmt, chunk_tokens=64) as w:
            for i in range(30):
                w.write(np.arange(i + 1))
    else:
        with lmdata.writer(url, fmt, size_limit=400) as w:
            for i in range(30):
                w.write({"id": i, "text": "old " * (i % 5)})


def _state(fmt, url):
    """'old', 'new', or 'none' (nothing opens); anything else fails the test."""
    try:
        r = lmdata.open(url, format=fmt)
    except LmdataError:
        return "none"
    assert lmdata.validate(url, format=fmt) == []
    if fmt == "flat-tokens":
        got = [x.tolist() for x in r]
        if got == [list(range(i + 1)) for i in range(30)]:
            return "old"
        assert got == [[7] * (i + 1) for i in range(40)]
    else:
        got = [x["text"] for x in r]
        if got == ["old " * (i % 5) for i in range(30)]:
            return "old"
        assert got == ["new " * (i % 9) for i in range(40)]
    return "new"


def _run(fmt, url, kill):
    return subprocess.run(
        [sys.executable, "-c", CHILD, fmt, url, str(kill)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


@pytest.mark.parametrize("fmt", ["mds", "flat-tokens"])
def test_writer_killed_at_any_request_leaves_old_or_nothing(s3_root, fmt):
    url = f"{s3_root}/{fmt}"
    _old(fmt, url)
    probe = f"{s3_root}/probe-{fmt}"
    _old(fmt, probe)
    done = _run(fmt, probe, 0)
    assert done.returncode == 0, done.stderr
    total = int(done.stdout.split()[-1])
    assert _state(fmt, probe) == "new"
    points = sorted({max(1, round(total * k / 12)) for k in range(1, 12)} | {total})
    seen = []
    for kill in points:
        res = _run(fmt, url, kill)
        assert res.returncode == -signal.SIGKILL, (kill, res.stderr)
        state = _state(fmt, url)
        seen.append(state)
        if state != "old":  # killed inside the commit: start the next point from the old one
            _restore(fmt, url)
    assert len(points) >= 10 and seen[0] == "old"  # killed early: the old dataset is intact
    assert set(seen) <= {"old", "new", "none"}


def _restore(fmt, url):
    from lmdata.storage import resolve

    store, key = resolve(url)
    store.remove(key)
    _old(fmt, url)


def test_two_writers_cannot_both_commit(s3_root):
    url = f"{s3_root}/race"
    a = lmdata.writer(url, "mds")
    b = lmdata.writer(url, "mds")  # both started before either committed
    a.write({"id": 1})
    b.write({"id": 1})
    a.close()
    with pytest.raises(OutputExistsError, match="another writer"):
        b.close()
    assert [x["id"] for x in lmdata.open(url)] == [1]


def test_overwrite_keeps_the_old_dataset_readable_until_commit(s3_root):
    url = f"{s3_root}/ow"
    _old("mds", url)
    w = lmdata.writer(url, "mds", overwrite=True, size_limit=400)
    for i in range(40):
        w.write({"id": i, "text": "new " * (i % 9)})
    assert _state("mds", url) == "old"  # new objects are staged under a .lmdata-tmp- name
    from lmdata.storage import resolve

    store, key = resolve(url)
    parent = key.rsplit("/", 1)[0]
    assert any(n.startswith(".lmdata-tmp-ow-") for n in store.list(parent))
    w.close()
    assert _state("mds", url) == "new"
    fresh = resolve(url)[0]  # a new listing (s3fs caches the one above)
    assert not any(n.startswith(".lmdata-tmp-") for n in fresh.list(parent))
