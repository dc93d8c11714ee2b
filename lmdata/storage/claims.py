"""Claims on object-store URLs: who writes a dataset, how far its commit got, and what is done
with one whose writer is gone.

Every write to an object store first creates, create-only, a claim beside its URL
(``.lmdata-writing-NAME``), so a second writer is refused at once. The claim names its writer
(host, process id and the process's start time, on a machine told apart by its boot and process
namespace), the job it belongs to (tokenize's or convert's work area, which ``--resume`` of
that job may take over) and, for a staged write, where its new objects wait. At commit a writer
of a directory rewrites it with its journal: the objects the commit puts in place. From the
claim alone anyone can then tell a dead writer from a running one on this machine, finish a
staged commit that a kill interrupted (roll forward from the staged copies: the new dataset,
never neither), or remove what a write that never reached its commit left (:func:`settle`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmdata.errors import LmdataError
from lmdata.storage.base import basename, join, parent
from lmdata.storage.paths import CLAIM

if TYPE_CHECKING:
    from lmdata.storage.fsspec import FsspecStore as Store

# (job, takeover): what claims made now name as their job, and whether a claim of that job whose
# writer is not running here may be taken over (``--resume``)
_JOB: contextvars.ContextVar[tuple[str | None, bool]] = contextvars.ContextVar(
    "lmdata_claim_job", default=(None, False)
)
# claims held by the writers of this process that are still writing: a claim of this process not
# among them is a dead writer's (one that failed, or gave up, without removing it)
_LIVE: set[tuple[str, str]] = set()
# (store id, destination, job): claims of a job being resumed that it settled itself
_OWN: set[tuple[str, str, str]] = set()


@contextlib.contextmanager
def claim_job(job: str, *, takeover: bool = False) -> Iterator[None]:
    """Claims made in this scope name ``job`` (a resumable job's work area, as a URL); with
    ``takeover`` (a resume), a claim of the same job is taken over unless its writer provably
    still runs on this machine."""
    token = _JOB.set((job, takeover))
    try:
        yield
    finally:
        _JOB.reset(token)


def hold(store: Store, key: str) -> None:
    _LIVE.add((store.id, key))


def release(store: Store, key: str) -> None:
    _LIVE.discard((store.id, key))


def claim_key(dest: str) -> str:
    """The claim of a write to ``dest``: ``.lmdata-writing-NAME`` beside it (older writers put
    ``DEST/.lmdata-writing`` inside a new directory; :func:`claimed` reads both)."""
    return join(parent(dest), f"{CLAIM}-{basename(dest)}")


def claimed(claim: str) -> str:
    """What a claim guards: the object or directory named after ``.lmdata-writing-``, or the
    directory holding an older writer's ``.lmdata-writing``."""
    name = basename(claim)
    return parent(claim) if name == CLAIM else join(parent(claim), name[len(CLAIM) + 1 :])


_MACHINE: list[str | None] = []


def machine() -> str | None:
    """This machine and process namespace, as claims record it; None where it cannot be told
    (no Linux ``/proc``): a claim's writer is then never judged by its process."""
    if not _MACHINE:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
            ns = os.readlink("/proc/self/ns/pid")
        except OSError:
            _MACHINE.append(None)
        else:
            _MACHINE.append(f"{socket.gethostname()} {boot} {ns}")
    return _MACHINE[0]


def process_start(pid: int) -> int | None:
    """When process ``pid`` of this machine started (clock ticks since boot), or None if it is
    not running (gone, or a zombie its parent has not waited for)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def claim_body(**fields: Any) -> bytes:
    """A claim of this process: who (host, pid, its start), since when, for which job, with
    ``fields`` (``stage``; at commit the journal: ``committing``, ``data``, ``marker``)."""
    from lmdata import _json

    job, _ = _JOB.get()
    pid = os.getpid()
    body: dict[str, Any] = {"host": socket.gethostname(), "pid": pid, "since": time.time()}
    here = machine()
    if here is not None:
        body.update(machine=here, start=process_start(pid))
    if job is not None:
        body["job"] = job
    body.update({k: v for k, v in fields.items() if v is not None})
    return _json.dumps(body)


def read_claim(store: Store, key: str) -> dict[str, Any] | None:
    """The claim at ``key``: None if there is none, ``{}`` if it is no claim lmdata can read."""
    from lmdata import _json

    try:
        data = store.read(key, 1 << 20)
    except FileNotFoundError:
        return None
    except (OSError, LmdataError):
        return {}
    try:
        info = _json.from_bytes(data, path=store.url(key), what="claim")
    except LmdataError:
        return {}
    return info if isinstance(info, dict) else {}


def writer_state(store: Store, key: str, info: dict[str, Any]) -> str:
    """``alive`` (a process of this machine still running: for this process, a writer still
    writing), ``dead`` (one of this machine that is gone), or ``unknown`` (another machine's,
    or a claim that does not say)."""
    here = machine()
    pid = info.get("pid")
    if here is None or info.get("machine") != here or not isinstance(pid, int):
        return "unknown"
    start = process_start(pid)
    if start is None or (info.get("start") is not None and start != info.get("start")):
        return "dead"  # gone, or the pid is another process's now
    if pid == os.getpid():
        return "alive" if (store.id, key) in _LIVE else "dead"
    return "alive"


@dataclass(frozen=True)
class Claim:
    """A claim found on a store: what it guards, its body, whether its writer runs, and what
    its write got to: ``finished`` (committed; only the claim, and maybe staged copies, are
    left), ``committing`` (a staged commit under way or cut short: finished by rolling it
    forward) or ``unfinished`` (never committed: its objects are no dataset)."""

    key: str
    dest: str
    info: dict[str, Any]
    writer: str
    outcome: str

    @property
    def stage(self) -> str | None:
        stage = self.info.get("stage")
        return stage if isinstance(stage, str) else None

    @property
    def also(self) -> list[str]:
        """The companion objects committed with the claimed one (a data file's index)."""
        also = self.info.get("also")
        return [k for k in also if isinstance(k, str)] if isinstance(also, list) else []

    @property
    def staged(self) -> list[str]:
        """Where the write stages objects: its stage, and its companions' beside it."""
        if self.stage is None:
            return []
        return [self.stage, *(also_stage(self.stage, i) for i in range(len(self.also)))]

    def removes(self) -> tuple[str, ...]:
        """What settling it removes (besides what a roll forward moves into place)."""
        if self.outcome == "unfinished" and self.stage is None:
            return (self.dest, self.key)  # a new dataset's objects, under their final names
        # a staged write never touched its destination before its commit
        return (*self.staged, self.key)


def inspect(store: Store, key: str, info: dict[str, Any] | None = None) -> Claim | None:
    """The claim at ``key`` (its body ``info`` if already read), or None if there is none."""
    if info is None:
        info = read_claim(store, key)
        if info is None:
            return None
    dest = claimed(key)
    stage = info.get("stage")
    names = info.get("committing")
    moves = info.get("moves")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        # one object written in place appears whole or not at all: there, it is finished
        # (with its companions, if it has any)
        pair = [dest, *(k for k in info.get("also") or [] if isinstance(k, str))]
        whole = stage is None and info.get("object") is True
        outcome = "finished" if whole and all(store.exists(k) for k in pair) else "unfinished"
    elif isinstance(moves, list):  # objects swapped under one journal: whole while staged
        sources = [m[0] for m in moves if isinstance(m, list) and len(m) == 2]
        there = bool(sources) and all(store.exists(k) for k in sources)
        outcome = "committing" if there and len(sources) == len(moves) else "finished"
    elif isinstance(stage, str):
        data = info.get("data")
        staged = set(listed(store, stage))
        every = [*(data if isinstance(data, list) else []), *names]
        # the stage goes only after the commit is done: whole, the commit may not be
        outcome = "committing" if every and all(n in staged for n in every) else "finished"
    else:
        there = store.exists(dest) and all(
            store.exists(join(dest, n) if n else dest) for n in names
        )
        outcome = "finished" if there else "unfinished"
    return Claim(key, dest, info, writer_state(store, key, info), outcome)


def listed(store: Store, key: str) -> list[str]:
    """Names (relative paths) of every object below ``key``, from one recursive listing."""
    fs = store.fs
    base = fs._strip_protocol(key).rstrip("/")
    fs.invalidate_cache(base)  # what other processes wrote since counts
    return [k[len(base) + 1 :] for k in fs.find(base) if k.startswith(base + "/")]


def may_settle(c: Claim, older_than: float | None = None, age: float | None = None) -> bool:
    """Whether ``c`` may be settled now: a finished write's claim always; otherwise not while
    its writer runs here, and only if it is provably gone, of the job being resumed, or (for
    ``lmdata clean``) untouched for ``older_than`` seconds."""
    if c.outcome == "finished":
        return True
    if c.writer == "alive":
        return False
    if c.writer == "dead":
        return True
    job, takeover = _JOB.get()
    if takeover and job is not None and c.info.get("job") == job:
        return True
    return older_than is not None and age is not None and age >= older_than


def settle(store: Store, c: Claim) -> None:
    """Finish what ``c``'s write left: roll a cut-short commit forward, or remove a write's
    leftovers (its staged copies, or the objects of a new dataset that never committed), then
    the claim."""
    from lmdata import _json

    if c.outcome == "committing" and isinstance(c.info.get("moves"), list):
        put_moves(store, c.info.get("gone") or [], c.info["moves"])
    elif c.outcome == "committing":
        stage = c.stage
        assert stage is not None
        data, last = c.info.get("data") or [], c.info["committing"]
        marker = c.info.get("marker")
        put_in_place(store, c.dest, stage, data, last, marker, _json.dumps(c.info))
    elif c.outcome == "finished" and c.stage is not None and c.info.get("marker"):
        store.remove(join(c.dest, c.info["marker"]))
    for k in c.removes():
        store.remove(k)


def takeover(store: Store, key: str) -> str:
    """Settle the claim at ``key`` if a writer may (it is gone, finished, or of the job being
    resumed): ``"stands"`` if it may not, else ``"gone"``, or ``"own"`` when the claim was the
    resumed job's own (what is at its URL now is that job's output, which the resume may
    replace: its bytes are the same)."""
    c = inspect(store, key)
    if c is None:
        return "gone"
    if not may_settle(c):
        return "stands"
    settle(store, c)
    job, resuming = _JOB.get()
    if resuming and job is not None and c.info.get("job") == job:
        _OWN.add((store.id, c.dest, job))
        return "own"
    return "gone"


def owned(store: Store, dest: str) -> bool:
    """Whether the job being resumed settled its own claim on ``dest`` in this process: what
    is there is that job's output, which the resume replaces with the same bytes."""
    job, resuming = _JOB.get()
    return resuming and (store.id, dest, job) in _OWN


def refusal(store: Store, key: str) -> str:
    """Why a writer cannot write where the claim ``key`` stands, and what to do."""
    info = read_claim(store, key) or {}
    who = ""
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["since"])))
        who = f" (pid {info['pid']} on {info['host']}, since {since})"
    except (KeyError, TypeError, ValueError, OverflowError):
        pass
    where = store.url(claimed(key))
    state = writer_state(store, key, info) if info else "unknown"
    if state == "alive":
        return f"another writer is writing a dataset here{who}; wait for it to finish"
    return (
        f"another writer is writing a dataset here{who}; wait for it to finish. If no writer "
        "is running (one was killed on another machine), finish or remove what it left with "
        f"`lmdata clean {where} --claims --older-than 0`"
    )


def also_stage(stage: str, i: int) -> str:
    """Where companion ``i`` of a one-object write staged at ``stage`` is staged."""
    return f"{stage}.{i}"


def put_moves(store: Store, gone: list[str], moves: list[Any]) -> None:
    """The moves of a pair's commit, each safe to repeat: the objects ``gone`` out first (an
    old index, so that no reader pairs it with new data), then each staged object over its
    destination, in order (the data, then its index)."""
    for k in gone:
        store.remove(k)
    for src, dst in moves:
        store.fs.copy(src, dst)


def put_in_place(
    store: Store,
    dest: str,
    stage: str,
    data: list[str],
    last: list[str],
    marker: str | None,
    journal: bytes,
    last_bytes: dict[str, bytes] | None = None,
) -> None:
    """The moves of a staged commit, each safe to repeat: ``marker`` (if any) into ``dest``
    (readers listing the tree refuse it from now on), the old objects out (the validating
    ``last`` ones first, so a reader opening the old dataset meanwhile fails), the staged
    ``data`` objects in (server-side copies), the ``last`` ones (``last_bytes`` create-only,
    else copied from the stage), and the marker out. FileExistsError if another writer put a
    validating object there first."""
    fs = store.fs
    strip = fs._strip_protocol
    mark = strip(join(dest, marker)) if marker else None
    if marker:
        store.put(join(dest, marker), journal)
    base = strip(dest)
    fs.invalidate_cache(base)
    old = [k for k in fs.find(base) if k != mark]
    first = {strip(join(dest, n) if n else dest) for n in last}
    for group in ([k for k in old if k in first], [k for k in old if k not in first]):
        if group:
            fs.rm(group)
    store.forget()
    if data:
        fs.copy([join(stage, n) for n in data], [join(dest, n) for n in data])
    for n in last:
        if last_bytes is not None:
            store.put(join(dest, n), last_bytes[n], create=True)
        else:
            fs.copy(join(stage, n), join(dest, n))
    if marker:
        store.remove(join(dest, marker))
