"""The integrity manifest: every file of a dataset with its size, record count and hashes.

lmdata's writers put it inside a dataset folder (``DIR/lmdata-manifest``) or beside a one-file
dataset (``FILE.lmdata-manifest``), written last. It is JSON, one file entry per line::

    {"lmdata_manifest":1,"hash":"xxh3-128","block_bytes":4194304,"made_by":"lmdata 0.1.0",
    "format":"mds","records":1000,"files":[
    {"name":"index.json","bytes":1234,"xxh3_128":"<32 hex>"},
    {"name":"shard.00000.mds","bytes":9000000,"xxh3_128":"<32 hex>","records":1000,
     "blocks":["<32 hex>","<32 hex>","<32 hex>"]}
    ]}

Names are ``/``-separated and relative to the folder holding the manifest. A file of more
than one block (``block_bytes``) lists each block's hash; its own hash is then the xxh3-128
of the blocks' 16-byte digests, else of its bytes (:mod:`lmdata.storage._digest`). A manifest
is parsed and checked here, once, as untrusted input: bounded size, every field checked. Its
bytes follow from the dataset's (the same data written twice gives the same manifest, so
outputs stay byte-identical whatever the workers); when it was made is its file's time.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from lmdata.errors import CorruptDataError, LmdataError
from lmdata.storage import _digest
from lmdata.storage._digest import Digest
from lmdata.storage.base import Store, basename, join, parent

NAME = "lmdata-manifest"  # inside a dataset folder
SUFFIX = ".lmdata-manifest"  # beside a one-file dataset: FILE.lmdata-manifest
VERSION = 1
HASH = "xxh3-128"
MAX_MANIFEST_BYTES = 256 << 20  # ~7 M files or blocks (28 TB in 4 MiB blocks)
MAX_NAME = 4096
_HEX = re.compile(r"[0-9a-f]{32}\Z")
_MIN_BLOCK, _MAX_BLOCK = 1 << 16, 1 << 30


@dataclass(frozen=True)
class FileEntry:
    """One file of a dataset as its writer left it."""

    name: str  # relative to the manifest's folder, "/"-separated
    size: int
    hash: str  # xxh3-128, 32 hex digits
    blocks: tuple[str, ...] = ()  # per-block hashes, for files of more than one block
    records: int | None = None  # records in the file, where the format has records

    @staticmethod
    def of(name: str, digest: Digest, records: int | None = None) -> FileEntry:
        return FileEntry(name, digest.size, digest.hash, digest.blocks, records)

    def block_hashes(self) -> tuple[str, ...]:
        """One hash per block: the file's own when it has one block."""
        return self.blocks or (self.hash,)

    def fits(self, block: int) -> bool:
        """Whether the entry's block hashes are of ``block``-byte blocks (entries carried from
        another manifest must be)."""
        return len(self.blocks) == (-(-self.size // block) if self.size > block else 0)

    def renamed(self, name: str) -> FileEntry:
        return FileEntry(name, self.size, self.hash, self.blocks, self.records)


@dataclass(frozen=True)
class Manifest:
    """What a manifest file holds (see the module docstring for its layout)."""

    files: tuple[FileEntry, ...]
    block: int = field(default_factory=lambda: _digest.BLOCK)
    made_by: str = ""
    format: str | None = None
    records: int | None = None

    def entries(self) -> dict[str, FileEntry]:
        return {f.name: f for f in self.files}

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_bytes(self) -> bytes:
        import orjson

        head = {
            "lmdata_manifest": VERSION,
            "hash": HASH,
            "block_bytes": self.block,
            "made_by": self.made_by,
            "format": self.format,
            "records": self.records,
        }
        lines = [orjson.dumps(head)[:-1] + b',"files":[']
        for i, f in enumerate(sorted(self.files, key=lambda f: f.name)):
            e: dict[str, object] = {"name": f.name, "bytes": f.size, "xxh3_128": f.hash}
            if f.records is not None:
                e["records"] = f.records
            if f.blocks:
                e["blocks"] = list(f.blocks)
            lines.append(orjson.dumps(e) + (b"," if i + 1 < len(self.files) else b""))
        lines.append(b"]}\n")
        return b"\n".join(lines)

    @staticmethod
    def parse(data: bytes, path: str) -> Manifest:
        """The manifest in ``data`` (read from ``path``), or CorruptDataError saying what is
        wrong with it."""
        from lmdata import _json

        obj = _json.from_bytes(
            data, path=path, what="manifest", max_bytes=MAX_MANIFEST_BYTES, max_depth=4
        )
        version = obj.get("lmdata_manifest")
        if type(version) is int and version > VERSION:
            raise LmdataError(
                f"manifest version {version} was made by a newer lmdata (this one reads "
                f"version {VERSION}); upgrade lmdata",
                path=path,
            )
        if version != VERSION:
            raise _bad(path, "is no lmdata manifest (no lmdata_manifest: 1)")
        if obj.get("hash") != HASH:
            raise _bad(path, f"names hash {obj.get('hash')!r}; lmdata writes {HASH!r}")
        block = obj.get("block_bytes")
        if type(block) is not int or not _MIN_BLOCK <= block <= _MAX_BLOCK or block & (block - 1):
            raise _bad(path, f"block_bytes {block!r} is no power of two in [64 KiB, 1 GiB]")
        files = obj.get("files")
        if not isinstance(files, list):
            raise _bad(path, "has no list of files")
        entries = tuple(_entry(e, i, block, path) for i, e in enumerate(files))
        seen: set[str] = set()
        for e in entries:
            if e.name in seen:
                raise _bad(path, f"lists {e.name!r} twice")
            seen.add(e.name)
        return Manifest(
            entries,
            block,
            _text(obj.get("made_by"), "made_by", path, 256),
            _text(obj.get("format"), "format", path, 64) or None,
            _count(obj.get("records"), "records", path),
        )


def modified(store: Store, key: str) -> str | None:
    """When the object ``key`` was last written (UTC, ISO 8601), or None if the store does
    not say: when a manifest was made."""
    import datetime as dt

    fs = getattr(store, "fs", None)
    try:
        if fs is None or store.can_mmap:
            import os

            t: object = os.stat(key).st_mtime
        else:
            info = fs.info(key)
            t = next(
                (info[k] for k in ("LastModified", "mtime", "updated", "created") if k in info),
                None,
            )
    except OSError:
        return None
    if isinstance(t, str):
        try:
            t = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
        except ValueError:
            return None
    if isinstance(t, dt.datetime):
        t = t.timestamp()
    if not isinstance(t, (int, float)):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(t)))


def _bad(path: str, what: str) -> CorruptDataError:
    return CorruptDataError(
        f"this manifest {what}; write a new one with `lmdata manifest` once the data is known "
        "good, or remove it",
        path=path,
    )


def _text(v: object, key: str, path: str, limit: int) -> str:
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > limit:
        raise _bad(path, f"has a {key} that is no string of at most {limit} characters")
    return v


def _count(v: object, key: str, path: str) -> int | None:
    if v is None:
        return None
    if type(v) is not int or not 0 <= v < 1 << 63:
        raise _bad(path, f"has a {key} that is no count: {v!r:.40}")
    return v


def check_name(name: object) -> str | None:
    """What is wrong with a file name of a manifest (None if nothing): names stay inside the
    dataset (relative, no ``..``, no empty part) whatever the manifest says."""
    if not isinstance(name, str) or not name:
        return "an empty or non-string name"
    if len(name) > MAX_NAME or "\\" in name or "\0" in name or name.startswith("/"):
        return f"the name {name[:80]!r}, which is no relative path"
    if any(p in ("", ".", "..") for p in name.split("/")):
        return f"the name {name[:80]!r}, which leaves the dataset or has an empty part"
    return None


def _entry(e: object, i: int, block: int, path: str) -> FileEntry:
    if not isinstance(e, dict):
        raise _bad(path, f"has file entry {i} that is no JSON object")
    name = e.get("name")
    problem = check_name(name)
    if problem:
        raise _bad(path, f"has {problem} (file entry {i})")
    assert isinstance(name, str)
    size = _count(e.get("bytes"), f"size for {name!r}", path)
    if size is None:
        raise _bad(path, f"has no size for {name!r}")
    digest = e.get("xxh3_128")
    if not isinstance(digest, str) or not _HEX.match(digest):
        raise _bad(path, f"has no 32-hex-digit xxh3_128 for {name!r}")
    blocks = e.get("blocks", [])
    want = -(-size // block) if size > block else 0
    if (
        not isinstance(blocks, list)
        or len(blocks) != want
        or not all(isinstance(b, str) and _HEX.match(b) for b in blocks)
    ):
        raise _bad(path, f"has no list of {want} block hashes for {name!r} ({size} bytes)")
    return FileEntry(name, size, digest, tuple(blocks), _count(e.get("records"), "records", path))


def location(store: Store, key: str, is_dir: bool | None = None) -> tuple[str, str]:
    """``(manifest key, folder its names are relative to)`` for the dataset at ``key``: inside
    a dataset folder, beside a one-file dataset."""
    key = key.rstrip("/") or key
    if is_dir is None:
        is_dir = store.is_dir(key)
    if is_dir:
        return join(key, NAME), key
    return key + SUFFIX, parent(key)


def is_manifest_name(name: str) -> bool:
    """Whether a file name is a manifest's (inside a folder or beside a file)."""
    return name == NAME or name.endswith(SUFFIX)


def read(store: Store, key: str) -> Manifest | None:
    """The manifest at ``key``, or None if there is none (one GET on an object store)."""
    try:
        if store.can_mmap:
            data = store.read(key, MAX_MANIFEST_BYTES)
        else:  # no HEAD first: a ranged GET of more than the limit says the size too
            data = store.read_range(key, 0, MAX_MANIFEST_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return Manifest.parse(data, store.url(key))


def own_name(key: str) -> str:
    """The name a one-file dataset's file has in its manifest."""
    return basename(key)
