"""Writing manifests: an ``Output`` that hashes what passes through it, and a local folder's.

:func:`output` is what format writers call instead of ``store.output``: the
:class:`ManifestOutput` it returns hashes every object on its way to the store (in the writer's
own pass, never a second one) and writes the manifest as the dataset's last object, inside
the folder's commit; a one-file dataset gets its manifest beside it, written after the file
(the old one is removed first, so a kill in between leaves no manifest, never a stale one).
:class:`LocalTree` serves writers that build a dataset in a local folder by paths (Atlas):
files written through it are hashed as they are written, the rest when the manifest is made.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from lmdata.storage import _digest
from lmdata.storage._digest import Digest, hash_bytes, hash_file, hashing_file
from lmdata.storage.base import Output, Store, basename, join, parent
from lmdata.storage.manifest import NAME, SUFFIX, FileEntry, Manifest, is_manifest_name
from lmdata.storage.paths import TMP_PREFIX


def made_by() -> str:
    from lmdata._version import __version__

    return f"lmdata {__version__}"


def output(
    store: Store,
    key: str,
    *,
    directory: bool,
    overwrite: bool,
    manifest: bool = True,
    format: str | None = None,
    local: bool = False,
    staged: bool = False,
    marker: str | None = None,
) -> ManifestOutput:
    """``store.output(key, ...)`` with a manifest written at commit (unless ``manifest`` is
    False: the output then only passes everything on)."""
    inner = store.output(
        key, directory=directory, overwrite=overwrite, local=local, staged=staged, marker=marker
    )
    return ManifestOutput(inner, directory=directory, enabled=manifest, format=format)


class ManifestOutput:
    """An :class:`~lmdata.storage.Output` that records the size and hashes of every object
    written through it (and the record counts the writer reports) and writes the manifest
    last. ``attach`` adds a second one-object output whose file the manifest lists too (a
    JSONL file's index beside it)."""

    def __init__(
        self,
        inner: Output,
        *,
        directory: bool,
        enabled: bool = True,
        format: str | None = None,
        group: ManifestOutput | None = None,
    ) -> None:
        self.inner = inner
        self.store = inner.store
        self.dest = inner.dest
        self.sparse = inner.sparse
        self.directory = directory
        self.enabled = enabled
        self.format = format
        self._digests: dict[str, Digest] = {}
        self._records: dict[str, int] = {}
        self._carried: dict[str, FileEntry] = {}
        self.block: int = group.block if group is not None else _digest.BLOCK
        self.records: int | None = None  # the dataset's records, when the writer says
        self._group = group if group is not None else self
        self._members: list[ManifestOutput] = [self]
        self._cleared = False

    # ---- the Output protocol ----------------------------------------------------------------

    @property
    def tmp(self) -> str | None:
        """The local path the dataset is built in (a local output), else None."""
        return self.inner.tmp

    def _name(self, name: str) -> str:
        """A name in the manifest: relative to the folder, or the one file's own name."""
        if self.directory:
            return name
        return join(basename(self.dest), name) if name else basename(self.dest)

    def write(self, name: str, data: bytes | memoryview) -> None:
        if self.enabled:
            self._note(name, hash_bytes(data, self.block))
        self.inner.write(name, data)

    def open_write(self, name: str) -> BinaryIO:
        f = self.inner.open_write(name)
        if not self.enabled:
            return f
        return hashing_file(f, lambda d: self._note(name, d), block=self.block)

    def write_last(self, name: str, data: bytes) -> None:
        if self.enabled:
            self._note(name, hash_bytes(data, self.block))
        self.inner.write_last(name, data)

    def commit(self) -> None:
        if self.inner.done:
            return
        group = self._group
        if not self.enabled:
            self.inner.commit()
            return
        if self.directory:
            self.inner.write_last(NAME, self.manifest().to_bytes())
            self.inner.commit()
            return
        group._clear_sibling()
        self.inner.commit()
        if all(m.inner.done for m in group._members):
            group._write_sibling()

    def abort(self) -> None:
        self.inner.abort()

    @property
    def done(self) -> bool:
        return self.inner.done

    # ---- what the manifest holds ------------------------------------------------------------

    def hashed(self, name: str, f: Any, path: str | None = None) -> BinaryIO:
        """``f``, a file the writer opened itself that becomes ``name`` (a local temporary
        file it seeks in), hashed as it is written."""
        if not self.enabled:
            return f  # type: ignore[no-any-return]
        return hashing_file(f, lambda d: self._note(name, d), path, self.block)

    def count(self, records: int, name: str | None = None) -> None:
        """Report ``records`` more records (in file ``name``, or in the dataset as a whole)."""
        if name is None:
            self.records = (self.records or 0) + records
        else:
            self._records[name] = self._records.get(name, 0) + records

    def adopt(self, entry: FileEntry) -> None:
        """List a file this output did not write (a merged input's, known from its own
        manifest) with the size and hashes given."""
        self._group._carried[entry.name] = entry

    def attach(self, other: Output) -> ManifestOutput:
        """A one-object output whose file this one's manifest lists as well (it must sit in
        the same folder of the same store); the manifest is written once both committed."""
        same = (
            self.enabled
            and not self.directory
            and other.store is self.store
            and parent(other.dest) == parent(self.dest)
        )
        out = ManifestOutput(
            other, directory=False, enabled=same, format=self.format, group=self if same else None
        )
        if same:
            self._members.append(out)
        return out

    def also(self, key: str) -> None:
        """The store output's pairing of a companion object with this one (an object store's
        :meth:`~lmdata.storage.FsspecOutput.also`), whose bytes :meth:`write_also` gives;
        the manifest lists it when it sits beside this one."""
        self.inner.also(key)  # type: ignore[attr-defined]

    def write_also(self, key: str, data: bytes) -> None:
        if self.enabled and not self.directory and parent(key) == parent(self.dest):
            self._group._digests[basename(key)] = hash_bytes(data, self.block)
        self.inner.write_also(key, data)  # type: ignore[attr-defined]

    def _note(self, name: str, digest: Digest) -> None:
        self._group._digests[self._name(name)] = digest

    def manifest(self) -> Manifest:
        files = dict(self._group._carried)
        records: dict[str, int] = {}
        for m in self._group._members:
            for name, n in m._records.items():
                records[m._name(name)] = records.get(m._name(name), 0) + n
        for name, d in self._group._digests.items():
            files[name] = FileEntry.of(name, d, records.get(name))
        total = self._group.records
        if total is None and records:
            total = sum(records.values())
        return Manifest(tuple(files.values()), made_by=made_by(), format=self.format, records=total)

    def _clear_sibling(self) -> None:
        """Remove the manifest an older file left beside this one, before replacing it."""
        if self._cleared:
            return
        self._cleared = True
        key = self.dest + SUFFIX
        if self.store.exists(key):
            self.store.remove(key)

    def _write_sibling(self) -> None:
        out = self.store.output(self.dest + SUFFIX, directory=False, overwrite=True)
        try:
            out.write_last("", self.manifest().to_bytes())
            out.commit()
        except BaseException:
            out.abort()
            raise


def skipped(name: str) -> bool:
    """Whether a file below a dataset folder is left out of its manifest: lmdata's staged or
    claim objects (``.lmdata-*``) and the manifest itself."""
    return any(part.startswith(".lmdata-") for part in name.split("/")) or is_manifest_name(
        basename(name)
    )


class LocalTree:
    """The manifest of a dataset built in a local folder by paths. Files opened through
    :meth:`open` are hashed as written and known by inode (so renames keep them); files
    hard-linked from a dataset with a manifest are known from it (:meth:`adopt_folder`);
    :meth:`write` hashes the rest."""

    def __init__(self, enabled: bool = True, format: str | None = None) -> None:
        self.enabled = enabled
        self.format = format
        self.records: int | None = None
        self._known: dict[tuple[int, int], tuple[int, int | None, Digest]] = {}
        self._records: dict[tuple[int, int], int] = {}
        self.block = _digest.BLOCK

    def open(self, path: str | os.PathLike[str]) -> BinaryIO:
        """``open(path, "wb")`` hashed as it is written (buffered: 1 MiB)."""
        p = os.fspath(path)
        if not self.enabled:
            return open(p, "wb", buffering=1 << 20)
        f = open(p, "wb", buffering=0)
        return hashing_file(f, lambda d: self._note(p, d), p, self.block)

    def _note(self, path: str, digest: Digest) -> None:
        st = os.stat(path)
        self._known[(st.st_dev, st.st_ino)] = (st.st_size, st.st_mtime_ns, digest)

    def count(self, path: str | os.PathLike[str], records: int) -> None:
        """``records`` in the file at ``path`` (known by inode: renames keep it)."""
        if self.enabled:
            st = os.stat(path)
            k = (st.st_dev, st.st_ino)
            self._records[k] = self._records.get(k, 0) + records

    def adopt(self, entries: Iterable[FileEntry], folder: str | os.PathLike[str]) -> None:
        """Files below ``folder`` (copies or hard links of another dataset's) are known from
        that dataset's manifest ``entries`` (names relative to ``folder``) where their sizes
        still match: a merge carries the hashes of what its inputs' writers wrote."""
        if not self.enabled:
            return
        for e in entries:
            p = os.path.join(os.fspath(folder), *e.name.split("/"))
            try:
                st = os.stat(p)
            except OSError:
                continue
            if st.st_size == e.size and e.fits(self.block):
                digest = Digest(e.size, e.hash, e.blocks)
                self._known[(st.st_dev, st.st_ino)] = (e.size, None, digest)
                if e.records is not None:
                    self._records[(st.st_dev, st.st_ino)] = e.records

    def manifest(self, root: str | os.PathLike[str]) -> Manifest:
        """Every file below ``root`` (lmdata's temporary names and the manifest left out)."""
        base = os.fspath(root)
        entries = []
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".lmdata-")]
            for f in files:
                p = os.path.join(dirpath, f)
                name = Path(os.path.relpath(p, base)).as_posix()
                if skipped(name):
                    continue
                st = os.stat(p)
                k = (st.st_dev, st.st_ino)
                known = self._known.get(k)
                if known and known[0] == st.st_size and known[1] in (None, st.st_mtime_ns):
                    digest = known[2]
                else:
                    digest = hash_file(p, self.block)
                entries.append(FileEntry.of(name, digest, self._records.get(k)))
        total = self.records
        if total is None and self._records:
            total = sum(e.records or 0 for e in entries)
        return Manifest(
            tuple(entries), self.block, made_by=made_by(), format=self.format, records=total
        )

    def write(self, root: str | os.PathLike[str]) -> None:
        """Put the manifest of ``root`` into it (a new file: the old one may be a hard link
        into the dataset an append extends)."""
        if self.enabled:
            _put(os.fspath(root), self.manifest(root).to_bytes())


class InPlace:
    """Keeps the manifest of a local dataset folder right while a writer changes it in place
    (seqax's append): :meth:`begin` notes every file and takes the manifest away (readers
    meanwhile see a dataset without one, never a stale one), :meth:`finish` writes it anew,
    its entries carried for the files left alone and hashed for those written (the dataset's
    record count is then unknown). Nothing happens for a folder without a manifest."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self._old: bytes | None = None
        self._seen: dict[str, tuple[int, int, int]] = {}

    def _files(self) -> dict[str, os.stat_result]:
        out = {}
        for dirpath, dirnames, files in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".lmdata-")]
            for f in files:
                p = os.path.join(dirpath, f)
                name = Path(os.path.relpath(p, self.root)).as_posix()
                if not skipped(name) and not f.endswith(".lmdata-tmp"):  # (a file replaced)
                    out[name] = os.stat(p)
        return out

    def begin(self) -> InPlace:
        path = os.path.join(self.root, NAME)
        try:
            with open(path, "rb") as f:
                self._old = f.read()
        except FileNotFoundError:
            return self
        Manifest.parse(self._old, path)  # refuse to carry what cannot be read
        self._seen = {n: (st.st_ino, st.st_mtime_ns, st.st_size) for n, st in self._files().items()}
        os.remove(path)
        return self

    def finish(self) -> None:
        if self._old is None:
            return
        path = os.path.join(self.root, NAME)
        old = Manifest.parse(self._old, path)
        carried = old.entries()
        entries = []
        for name, st in sorted(self._files().items()):
            e = carried.get(name)
            if e is not None and self._seen.get(name) == (st.st_ino, st.st_mtime_ns, st.st_size):
                entries.append(e)
            else:
                digest = hash_file(os.path.join(self.root, name), old.block)
                entries.append(FileEntry.of(name, digest))
        m = Manifest(tuple(entries), old.block, made_by=made_by(), format=old.format)
        _put(self.root, m.to_bytes())
        self._old = None

    def abort(self) -> None:
        """After a failed change: the manifest of what the folder holds now (the writer put
        back or left what readers use; a chunk it rewrote may hold more bytes than they
        read), or, failing that, the old one."""
        if self._old is None:
            return
        try:
            self.finish()
        except Exception:
            _put(self.root, self._old)
            self._old = None


def _put(root: str, data: bytes) -> None:
    """The manifest of a local folder written whole (a temporary name, then renamed)."""
    tmp = os.path.join(root, f"{TMP_PREFIX}{NAME}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(root, NAME))
