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
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lmdata.storage import basename, join, parent, resolve

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

    where: str  # shown in messages

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

    store: Any  # an FsspecStore: pickled with its storage options, as readers are
    key: str

    @property
    def where(self) -> str:
        return str(self.store.url(self.key))

    def exists(self) -> bool:
        return bool(self.store.exists(join(self.key, "manifest.json")))

    def manifest(self) -> bytes | None:
        k = join(self.key, "manifest.json")
        return bytes(self.store.read(k)) if self.store.exists(k) else None

    def reset(self, manifest: bytes) -> None:
        self.clear()
        self.store.write_object(join(self.key, "manifest.json"), manifest)

    def parts(self) -> list[str]:
        return self.store.list(join(self.key, "parts"))

    def write_part(self, name: str, data: bytes) -> None:
        self.store.write_object(join(self.key, "parts", name), data)

    def read_part(self, name: str) -> bytes:
        return bytes(self.store.read(join(self.key, "parts", name)))

    def remove_part(self, name: str) -> None:
        self.store.remove(join(self.key, "parts", name))

    def done(self) -> set[tuple[int, int]]:
        return {unit_key(n) for n in self.store.list(join(self.key, "done")) if _UNIT.fullmatch(n)}

    def mark_done(self, file: int, part: int) -> None:
        self.store.write_object(join(self.key, "done", unit_name(file, part)), b"")

    def clear(self) -> None:
        self.store.remove(self.key)


def work_dir_for(dst: Path) -> Path:
    """The staging folder of a local output: hidden, beside it."""
    return dst.parent / f".{dst.name}.lmdata-work"


def staging_for(
    out: str | os.PathLike[str], storage_options: dict[str, Any] | None, job: str = "work"
) -> Staging:
    """The staging area of output ``out`` (``.NAME.lmdata-JOB``): beside it (a local folder,
    or a prefix on its object store); for ``memory://``, which lives in one process, a local
    temp folder."""
    store, key = resolve(out, storage_options)
    if store.id == "file":
        k = Path(key)
        return LocalStaging(str(k.parent / f".{k.name}.lmdata-{job}"))
    if store.id == "memory":
        digest = hashlib.sha256(os.fspath(out).encode()).hexdigest()[:16]
        return LocalStaging(os.path.join(tempfile.gettempdir(), f"lmdata-{job}-{digest}"))
    return StoreStaging(store, join(parent(key), f".{basename(key)}.lmdata-{job}"))
