"""Where workers stage their results: a folder beside a local output, or a prefix beside an
output URL on its object store, so a worker on any node of a cluster writes its own results
and the driver only commits them, in input order (tokenize's parts, convert's token blocks).

Layout: ``manifest.json`` (the job and its inputs, which ``--resume`` must match), ``parts/``
(``FFFFFF-PPPPPP-SSSSSS.npz``: file, unit, part) and the units done (locally one append-only
``done.log``; on an object store, which cannot append, one empty ``done/FFFFFF-PPPPPP`` object
per unit). A part is written whole (a rename, or one PUT), so a retried task that writes the
same part again replaces it, never half of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lmdata._redact import redact_record
from lmdata.errors import CorruptDataError, FormatError, InvalidInputError, UnsafeDataError
from lmdata.storage import Store, basename, join, parent, resolve
from lmdata.storage.paths import work_name

DONE_LOG = "done.log"  # local: one line "FFFFFF-PPPPPP" per unit committed, appended in order
_UNIT = re.compile(r"\d{6,}-\d{6,}")


def unit_key(name: str) -> tuple[int, int]:
    """(file, unit) of a part or done-marker name."""
    file, part = name.split("-")[:2]
    return int(file), int(part.split(".")[0])


def unit_name(file: int, part: int) -> str:
    return f"{file:06d}-{part:06d}"


class Staging(Protocol):
    """The staging area of one job; picklable, so each worker writes its parts itself."""

    @property
    def where(self) -> str: ...  # shown in messages

    def exists(self) -> bool: ...

    def manifest(self) -> bytes | None: ...

    def reset(self, manifest: bytes) -> None:
        """Empty the area and record ``manifest`` (a new job)."""
        ...

    def parts(self) -> list[str]:
        """Every name under ``parts/``, sorted (parts sort in input order; a name starting
        with "." is a write a kill interrupted)."""
        ...

    def write_part(self, name: str, data: bytes) -> None: ...

    def read_part(self, name: str) -> bytes: ...

    def remove_part(self, name: str) -> None: ...

    def done(self) -> set[tuple[int, int]]: ...

    def mark_done(self, file: int, part: int) -> None: ...

    def clear(self) -> None: ...


@dataclass(frozen=True)
class LocalStaging:
    """A folder on this machine (on a cluster: a shared filesystem every node mounts)."""

    path: str

    @property
    def where(self) -> str:
        return self.path

    def exists(self) -> bool:
        """A job's area: its manifest, written last by :meth:`reset`, is there."""
        return os.path.isfile(os.path.join(self.path, "manifest.json"))

    def manifest(self) -> bytes | None:
        try:
            return Path(self.path, "manifest.json").read_bytes()
        except FileNotFoundError:
            return None

    def reset(self, manifest: bytes) -> None:
        self.clear()
        os.makedirs(os.path.join(self.path, "parts"))
        Path(self.path, DONE_LOG).touch()
        tmp = os.path.join(self.path, f".manifest.{uuid.uuid4().hex}.tmp")
        Path(tmp).write_bytes(manifest)
        os.replace(tmp, os.path.join(self.path, "manifest.json"))  # a kill leaves none or all

    def parts(self) -> list[str]:
        return sorted(os.listdir(os.path.join(self.path, "parts")))

    def write_part(self, name: str, data: bytes) -> None:
        final = os.path.join(self.path, "parts", name)
        tmp = os.path.join(self.path, "parts", f".{name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, final)

    def read_part(self, name: str) -> bytes:
        return Path(self.path, "parts", name).read_bytes()

    def remove_part(self, name: str) -> None:
        os.unlink(os.path.join(self.path, "parts", name))

    def done(self) -> set[tuple[int, int]]:
        """A last line a kill cut short (no newline) does not count: that unit is redone."""
        text = Path(self.path, DONE_LOG).read_text(encoding="ascii", errors="replace")
        return {unit_key(x) for x in text.split("\n")[:-1] if _UNIT.fullmatch(x)}

    def mark_done(self, file: int, part: int) -> None:
        # appending to one log: a file per unit costs a create each (~2 ms on busy disks)
        with open(os.path.join(self.path, DONE_LOG), "a", encoding="ascii") as fh:
            fh.write(unit_name(file, part) + "\n")

    def clear(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass(frozen=True)
class StoreStaging:
    """A prefix on an object store (the output's): workers anywhere write it directly."""

    store: Store  # an object store: pickled with its storage options, as readers are
    key: str

    @property
    def where(self) -> str:
        return str(self.store.url(self.key))

    def _fresh(self, folder: str = "") -> str:
        """The key of ``folder`` of the area, with this process's cached listing of it
        dropped: workers in other processes write there, so a listing made before is stale
        (an object they wrote since would read as missing)."""
        k = join(self.key, folder) if folder else self.key
        self.store.refresh(k)
        return k

    def exists(self) -> bool:
        return bool(self.store.exists(join(self._fresh(), "manifest.json")))

    def manifest(self) -> bytes | None:
        k = join(self._fresh(), "manifest.json")
        return bytes(self.store.read(k)) if self.store.exists(k) else None

    def reset(self, manifest: bytes) -> None:
        self.clear()
        self.store.put(join(self.key, "manifest.json"), manifest)

    def parts(self) -> list[str]:
        return self.store.list(self._fresh("parts"))

    def write_part(self, name: str, data: bytes) -> None:
        self.store.put(join(self.key, "parts", name), data)

    def read_part(self, name: str) -> bytes:
        return bytes(self.store.read(join(self._fresh("parts"), name)))

    def remove_part(self, name: str) -> None:
        self.store.remove(join(self.key, "parts", name))

    def done(self) -> set[tuple[int, int]]:
        return {unit_key(n) for n in self.store.list(self._fresh("done")) if _UNIT.fullmatch(n)}

    def mark_done(self, file: int, part: int) -> None:
        self.store.put(join(self.key, "done", unit_name(file, part)), b"")

    def clear(self) -> None:
        self.store.remove(self.key)


def work_dir_for(dst: Path) -> Path:
    """The staging folder of a local output: hidden, beside it."""
    return dst.parent / work_name(dst.name, "work")


def staging_for(
    out: str | os.PathLike[str], storage_options: dict[str, Any] | None, job: str = "work"
) -> Staging:
    """The staging area of output ``out`` (``.NAME.lmdata-JOB``): beside it (a local folder,
    or a prefix on its object store); for ``memory://``, which lives in one process, a local
    temp folder."""
    store, key = resolve(out, storage_options)
    if store.id == "file":
        k = Path(key)
        return LocalStaging(str(k.parent / work_name(k.name, job)))
    if store.id == "memory":
        digest = hashlib.sha256(os.fspath(out).encode()).hexdigest()[:16]
        return LocalStaging(os.path.join(tempfile.gettempdir(), f"lmdata-{job}-{digest}"))
    return StoreStaging(store, join(parent(key), work_name(basename(key), job)))


# ---- resuming ----------------------------------------------------------------------------------


def prepare(work: Staging, manifest: bytes, resume: bool, job: str = "job") -> set[tuple[int, int]]:
    """Start ``work`` for a new job (emptying what another left), or, resuming, check that
    ``manifest`` is the interrupted job's and drop the parts of its unfinished units; return
    the units done. A different job is refused, naming what changed. The manifest is kept
    with its secrets masked (:func:`lmdata._redact.redact_record`): a work folder may be seen
    by others."""
    manifest = _masked(manifest)
    if resume and work.exists():
        old = work.manifest()
        if old != manifest:
            changed = manifest_changes(old, manifest)
            what = "the inputs or options differ"
            if changed:
                what = f"{', '.join(changed[:4])} {'differs' if len(changed) == 1 else 'differ'}"
            raise InvalidInputError(
                f"cannot resume: {what} from the interrupted {job}'s; run again without "
                f"--resume (which discards {work.where})",
                path=work.where,
            )
        done = work.done()
        for name in work.parts():  # parts of unfinished units (and torn writes) are redone
            if name.startswith(".") or unit_key(name) not in done:
                work.remove_part(name)
        return done
    work.reset(manifest)
    return set()


def _masked(manifest: bytes) -> bytes:
    """``manifest`` with its secrets masked; the same bytes when it holds none (or is no JSON)."""
    try:
        obj = json.loads(manifest)
    except ValueError:
        return manifest
    hidden = redact_record(obj)
    return manifest if hidden == obj else json.dumps(hidden, sort_keys=True).encode()


def resumable(e: BaseException) -> bool:
    """Whether a job stopped by ``e`` keeps its staging area for ``--resume``: not when the data
    or the options are at fault (the same job would stop there again); yes for Ctrl-C, a dead
    worker, a full disk, a missing dependency, a store's hiccup."""
    return not isinstance(e, (InvalidInputError, FormatError, CorruptDataError, UnsafeDataError))


def manifest_changes(old: bytes | None, new: bytes) -> list[str]:
    """Where two JSON manifests differ, as dotted paths (``source.digest``); [] when either
    is no JSON object."""
    try:
        a, b = json.loads(old or b""), json.loads(new)
    except ValueError:
        return []
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    return [".".join(at) for at in json_changes(a, b)]


def json_changes(a: Any, b: Any) -> list[tuple[str, ...]]:
    """Where two decoded JSON values differ: the key path of each differing leaf, objects
    walked key by key in sorted order (a key one side lacks reads as None there); ``[()]`` when
    ``a`` and ``b`` differ and are not both objects. One mechanism for every resume check
    (staging's manifests here, dedupe's in :mod:`lmdata.dolma._dedupe_resume`)."""
    out: list[tuple[str, ...]] = []

    def walk(x: Any, y: Any, at: tuple[str, ...]) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), (*at, str(k)))
        elif x != y:
            out.append(at)

    walk(a, b, ())
    return out


def tree_version(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The size, number of files and a digest of a file or of every file below a folder (local
    or on a store, with the storage options in scope): each file's name, size and modification
    time (on a store: its ETag or generation, else the time written), so a resumed job notices
    a source that changed since it was interrupted."""
    store, key = resolve(path)
    h = hashlib.sha256()
    size = files = 0
    for name, (n, tag) in sorted(store.versions(key).items()):
        h.update(f"{name}\0{n}\0{tag}\n".encode())
        size, files = size + n, files + 1
    return {"size": size, "files": files, "digest": h.hexdigest()}
