"""The local store: streamed writes are buffered and appear only on commit; reads through
kept-open files stay right across threads, evictions and forks."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading

import pytest

from lmdata.errors import DatasetChangedError
from lmdata.storage import LocalStore
from lmdata.storage.local import MAX_OPEN_FILES
from tests.storage._threads import run_threads


def test_open_write_buffers_small_pieces(tmp_path):
    out = LocalStore().output(str(tmp_path / "f.bin"), directory=False, overwrite=False)
    f = out.open_write("")
    for _ in range(4000):
        f.write(b"x" * 100)  # 400 kB in small pieces, as record writers append them
    # still in the buffer: an unbuffered or default-buffered (8 KiB) file has written most of it
    assert os.path.getsize(out.tmp) == 0
    f.close()
    assert not (tmp_path / "f.bin").exists()
    out.commit()
    assert (tmp_path / "f.bin").read_bytes() == b"x" * 400_000


def _files(tmp_path, n: int, size: int = 5000) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        p = tmp_path / f"f{i}"
        data = random.Random(i).randbytes(size)
        p.write_bytes(data)
        out.append((str(p), data))
    return out


def _in_fork(child) -> None:
    """Run ``child()`` in a forked child; fails unless it returns without raising."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        signal.alarm(120)  # a child stuck on a lock dies instead of hanging the test
        try:
            child()
            msg = b"ok"
        except BaseException as e:
            msg = repr(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read()
    _, status = os.waitpid(pid, 0)
    assert got == b"ok" and os.waitstatus_to_exitcode(status) == 0, got


needs_fork = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="fork")


@needs_fork
def test_a_forked_child_opens_its_own_files(tmp_path):
    (key, old), (_, new) = _files(tmp_path, 2)
    store = LocalStore()
    assert store.read_range(key, 100, 50) == old[100:150]
    parent_fd = store._fds[key].fd
    os.replace(tmp_path / "f1", key)  # the name now holds other bytes; the parent's file is kept
    assert store.read_range(key, 100, 50) == old[100:150]

    def child():
        try:
            os.fstat(parent_fd)  # the parent's descriptor was dropped at fork, not inherited
        except OSError:
            pass
        else:
            raise AssertionError("the child kept the parent's descriptor")
        # opened the name anew: another file than the one the parent pinned, which the store
        # refuses to mix in; once told to forget its pins, it reads the new file
        with pytest.raises(DatasetChangedError, match="replaced"):
            store.read_range(key, 100, 50)
        store.forget()
        assert store.read_range(key, 100, 50) == new[100:150]
        assert store.read_ranges(key, [(0, 10), (4990, 10)]) == [new[:10], new[4990:]]
        store.close()

    _in_fork(child)
    assert store.read_range(key, 0, 10) == old[:10]  # the child's close left the parent's files


@needs_fork
def test_a_forked_child_reads_while_a_parent_thread_holds_the_store_lock(tmp_path):
    (key, data), (other, other_data) = _files(tmp_path, 2)
    store = LocalStore()
    assert store.read_range(key, 0, 10) == data[:10]
    held, release = threading.Event(), threading.Event()

    def hold():
        with store._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(30)
    try:
        # a file the store has not opened yet: opening it takes the lock
        _in_fork(lambda: store.read_range(other, 10, 20) == other_data[10:30] or 1 / 0)
    finally:
        release.set()
        t.join()


def test_threads_read_right_bytes_while_files_are_evicted(tmp_path):
    files = _files(tmp_path, MAX_OPEN_FILES * 2 + 5, size=2000)
    store = LocalStore()
    bad = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(3000):
            key, data = rng.choice(files)
            s = rng.randrange(1990)
            if rng.random() < 0.5:
                got = store.read_range(key, s, 10)
            else:
                got = store.read_ranges(key, [(s, 10)])[0]
            if got != data[s : s + 10]:
                bad.append((key, s))

    run_threads(work, 6)
    assert bad == []
    assert len(store._fds) <= MAX_OPEN_FILES


def test_an_evicted_file_stays_open_while_a_read_holds_it(tmp_path):
    files = _files(tmp_path, MAX_OPEN_FILES + 10, size=100)
    store = LocalStore()
    held = store._open(files[0][0])  # what a read holds between its lookup and its pread
    fd = held.fd
    for key, _ in files[1:]:
        store.read_range(key, 0, 1)
    assert files[0][0] not in store._fds  # evicted
    os.fstat(fd)  # still open: another file opened meanwhile cannot have taken its number
    assert os.pread(fd, 10, 0) == files[0][1][:10]
    del held
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with the last reference


def test_a_file_in_use_stays_open_while_many_others_pass(tmp_path, monkeypatch):
    files = _files(tmp_path, MAX_OPEN_FILES * 3, size=100)
    hot, data = files[0]
    opened = []
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(p) or real(p, *a, **k))
    store = LocalStore()
    for key, _ in files[1:]:
        assert store.read_range(hot, 5, 5) == data[5:10]
        store.read_range(key, 0, 1)
    assert opened.count(hot) == 1  # evicting in order of opening would reopen it twice
    assert len(store._fds) <= MAX_OPEN_FILES
    store.close()
    assert store._fds == {}


def test_a_dropped_handle_closes_its_file_even_with_the_module_globals_cleared(
    tmp_path, monkeypatch
):
    # at interpreter shutdown a module in a cycle can have its globals set to None while its
    # last handles are still to go: the handle closes its file all the same, and quietly
    from lmdata.storage import local

    (key, _), (other, _) = _files(tmp_path, 2)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    fd = os.open(key, os.O_RDONLY)
    h = local._Handle(fd)
    monkeypatch.setattr(local, "os", None)
    del h
    monkeypatch.setattr(local, "os", os)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    closed = local._Handle(os.open(other, os.O_RDONLY))
    os.close(closed.fd)  # already closed when dropped: nothing to do, nothing to say
    del closed
    assert unraisable == []


def test_eviction_passes_over_files_read_again_and_drops_the_oldest_other(tmp_path):
    files = _files(tmp_path, MAX_OPEN_FILES + 1, size=100)
    keys = [k for k, _ in files]
    store = LocalStore()
    for k in keys[:MAX_OPEN_FILES]:
        store.read_range(k, 0, 1)
    for k in keys[:5] + keys[6:MAX_OPEN_FILES]:
        store.read_range(k, 1, 1)  # read again: all but the sixth
    store.read_range(keys[-1], 0, 1)
    # the five before it had their second chance (moved back, unmarked); those after it kept
    # their mark, as the scan stopped at the first file not read again
    order = keys[6:MAX_OPEN_FILES] + keys[:5] + keys[-1:]
    assert list(store._fds) == order
    assert [store._fds[k].used for k in order] == [True] * (MAX_OPEN_FILES - 6) + [False] * 6


def test_eviction_ends_when_reads_mark_every_file_again_as_it_scans(tmp_path):
    from lmdata.storage import local

    scanned = []

    class Busy(local._Handle):
        """A file that threads read again each time the scan clears it."""

        __slots__ = ()

        @property
        def used(self):
            scanned.append(self)
            if len(scanned) > 10 * MAX_OPEN_FILES:
                raise AssertionError("the eviction scan does not end")
            return True

        @used.setter
        def used(self, value):
            pass

    files = _files(tmp_path, MAX_OPEN_FILES + 1, size=100)
    store = LocalStore()
    for k, _ in files[:MAX_OPEN_FILES]:
        store._fds[k] = Busy(os.open(k, os.O_RDONLY))
    key, data = files[-1]
    assert store.read_range(key, 10, 5) == data[10:15]
    # every file got its one second chance; then the oldest went all the same
    assert list(store._fds) == [k for k, _ in files[1:]]


def _open_fds(under) -> int:
    """Descriptors of this process open on files below ``under`` (not every descriptor: a
    thread an earlier test left in this process may open and close its own meanwhile)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(under))
        except OSError:  # closed since the listing
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="/proc")
def test_a_collected_store_leaves_no_descriptor_open(tmp_path):
    """LocalStore has no __del__ (it had one calling close() under ``except Exception``):
    when a store goes, its dict of handles goes with it and each handle closes its own file,
    once the read holding it (if any) is done; a store in a reference cycle too."""
    import gc

    files = []
    for i in range(10):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 100)
        files.append(str(p))
    gc.collect()  # (stores of earlier tests left in cycles)
    before = _open_fds(tmp_path)
    store = LocalStore()
    for f in files:
        assert store.read_range(f, 0, 3) == bytes([int(f[-1])]) * 3
    held = store._fds[files[0]]  # as a read in flight holds it
    assert _open_fds(tmp_path) == before + 10
    del store
    assert _open_fds(tmp_path) == before + 1
    os.fstat(held.fd)
    del held
    assert _open_fds(tmp_path) == before
    cyclic = LocalStore()
    cyclic.me = cyclic  # type: ignore[attr-defined]
    cyclic.read_range(files[1], 0, 1)
    del cyclic
    gc.collect()
    assert _open_fds(tmp_path) == before
