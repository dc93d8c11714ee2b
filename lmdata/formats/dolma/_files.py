"""Files of a Dolma tree: which names are documents, where their attributes live, how to
decode them (gzip, zstd or plain, inferred from the extension as dolma does) and how to write
gzip the same way every time.

Every file is reached through a :class:`lmdata.storage.Store` and a key: local paths and
``memory://``, ``s3://``, ``gs://`` URLs alike. Files are read in chunks of ranged reads and
written as single objects that appear whole when committed (:class:`OutputFile`).
"""

from __future__ import annotations

import glob
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

# zlib-ng, which dolma's Rust I/O (flate2) uses too: at level 6 it compresses ~1.5x and
# decompresses ~1.3x faster than the zlib Python is built with (measured on Dolma documents)
from zlib_ng import zlib_ng as zlib

from lmdata.errors import CorruptDataError, FormatError, InvalidInputError
from lmdata.storage import LocalStore, Store, basename, is_url, join, parent, resolve, scheme

# Extensions dolma reads (compression is inferred from the name, like smart_open / src/io.rs).
DOC_SUFFIXES = (
    ".jsonl.gz",
    ".json.gz",
    ".jsonl.zst",
    ".json.zst",
    ".jsonl.zstd",
    ".jsonl",
    ".json",
)
READ_CHUNK = 1 << 20
REMOTE_CHUNK = 8 << 20  # object stores: fewer, larger ranged reads (one request each)
# The longest line read (decompressed bytes, without its newline). A longer line is refused
# before it is held whole: a small .gz can hold one line of gigabytes (a decompression bomb).
# Readers take ``max_line_bytes=`` to change it.
MAX_LINE_BYTES = 256 << 20
OUT_PIECE = 8 << 20  # decoders hand out decompressed data in pieces of at most this size
_ZSTD_SLICE = 2048  # zstd input fed at a time: at most ~64 MiB of output (ratio <= 32768)


def is_doc_file(name: str) -> bool:
    return name.endswith(DOC_SUFFIXES) and not name.startswith(".")


def codec_of(path: str | os.PathLike[str]) -> str:
    """``gz``, ``zst`` or ``none``."""
    name = os.fspath(path)
    if name.endswith(".gz"):
        return "gz"
    if name.endswith((".zst", ".zstd")):
        return "zst"
    return "none"


def shown(store: Store, key: str) -> Path | str:
    """How a file is handed to users: a local Path, or the URL of an object."""
    return Path(key) if isinstance(store, LocalStore) else store.url(key)


class Stores:
    """``(store, key)`` for the many paths of one job, with one store per scheme (a
    filesystem client is made once, not once per file)."""

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = storage_options
        self._by_id: dict[str, Store] = {}

    def __call__(self, path: str | os.PathLike[str]) -> tuple[Store, str]:
        store, key = resolve(path, self.storage_options)
        return self._by_id.setdefault(store.id, store), key


def is_file(store: Store, key: str) -> bool:
    """True if ``key`` is a file (one metadata request on object stores, not two)."""
    if isinstance(store, LocalStore):
        return os.path.isfile(key)
    try:
        store.size(key)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False
    return True


def documents_dir(store: Store, root: str) -> str:
    """The ``documents`` folder of a tree given as the tree root or as the folder itself."""
    if basename(root) == "documents" and store.is_dir(root):
        return root
    return join(root, "documents")


def tree_root(store: Store, key: str) -> str:
    """The tree of a path given as the tree root or as its ``documents`` folder."""
    return parent(key) if basename(key) == "documents" and store.is_dir(key) else key


def walk_files(store: Store, top: str) -> Iterator[str]:
    """Keys of every file below ``top`` (hidden folders skipped), in no particular order."""
    if isinstance(store, LocalStore):  # scandir: one call per folder
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            yield from (os.path.join(dirpath, f) for f in files)
        return
    fs = getattr(store, "fs", None)
    if fs is not None:  # fsspec: one recursive listing, not one request per folder and entry
        base = top.rstrip("/") + "/"
        for k in fs.find(top):
            hidden = any(p.startswith(".") for p in k[len(base) :].split("/")[:-1])
            if k.startswith(base) and not hidden:
                yield k
        return
    todo = [top]
    while todo:
        d = todo.pop()
        for name in store.list(d):
            key = join(d, name)
            if store.is_dir(key):
                if not name.startswith("."):
                    todo.append(key)
            else:
                yield key


def list_documents(store: Store, root: str) -> list[str]:
    """Every document file below ``root/documents``, sorted by relative path (input order)."""
    ddir = documents_dir(store, root)
    if not store.is_dir(ddir):
        raise FormatError(
            "not a Dolma tree: no documents/ folder (a Dolma dataset keeps its JSONL files under "
            "<dataset>/documents/)",
            path=store.url(root),
        )
    out = [k for k in walk_files(store, ddir) if is_doc_file(basename(k))]
    cut = len(ddir.rstrip("/")) + 1
    return sorted(out, key=lambda k: k[cut:].replace(os.sep, "/"))


def _component_regex(part: str) -> str:
    """A glob of one path component as a regex that never crosses a ``/``."""
    out = []
    i = 0
    while i < len(part):
        c = part[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            start = i + (part[i : i + 1] == "!")
            end = part.find("]", start + (part[start : start + 1] == "]"))
            if end < 0:
                out.append(re.escape(c))
                continue
            body = part[i:end]
            neg = body.startswith("!")
            # as fnmatch: every character of the set literal ("[^a]" is "^" or "a")
            body = re.sub(r"([\\\[^&~|])", r"\\\1", body[1:] if neg else body)
            out.append("[" + ("^" if neg else "") + body + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
    return "".join(out)


def glob_keys(store: Store, pattern: str) -> list[str]:
    """Keys of the files matching ``pattern`` (``*``, ``?``, ``[..]`` within a name, ``**``
    over folders; names starting with a dot only when the pattern says so), sorted."""
    parts = pattern.split("/")
    first = next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))
    if first == len(parts):
        return [pattern] if is_file(store, pattern) else []
    top = "/".join(parts[:first]) or "/"
    rest = parts[first:]
    rx = []
    for i, p in enumerate(rest):
        last = i == len(rest) - 1
        if p == "**":
            rx.append(r"[^/.][^/]*(?:/[^/.][^/]*)*" if last else r"(?:[^/.][^/]*/)*")
        else:
            hidden = "" if p.startswith(".") else r"(?!\.)"
            rx.append(hidden + _component_regex(p) + ("" if last else "/"))
    try:
        regex = re.compile("".join(rx) + r"\Z", re.S)
    except re.error as e:  # e.g. a reversed range "[z-a]"
        raise InvalidInputError(f"bad glob pattern {pattern!r}: {e}") from None
    cut = len(top.rstrip("/")) + 1
    hits = [k for k in walk_files(store, top) if regex.match(k[cut:])]
    return sorted(hits)


def expand_globs(
    patterns: list[str] | tuple[str, ...],
    base: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Document files (local paths or URLs, as given) matching ``patterns`` (``**``
    allowed), each pattern's matches sorted, duplicates dropped; relative local patterns are
    taken from ``base`` (default: the cwd)."""
    seen: set[str] = set()
    out: list[str] = []
    for pat in patterns:
        if is_url(pat) and scheme(pat) != "file":
            store, key = resolve(pat, storage_options)
            matches = [store.url(k) for k in glob_keys(store, key)]
        else:
            pat = str(resolve(pat)[1]) if is_url(pat) else pat
            full = pat if base is None or os.path.isabs(pat) else os.path.join(base, pat)
            matches = sorted(glob.glob(full, recursive=True))
            if not matches and not glob.has_magic(full) and os.path.isfile(full):
                matches = [full]
            matches = [m for m in matches if os.path.isfile(m)]
        for m in matches:
            if m not in seen:
                seen.add(m)
                out.append(m)
    return out


def attribute_path(doc_path: str, name: str) -> str:
    """Where attribute set ``name`` of a document file lives: the last ``documents`` component
    of the path (a key or a URL) replaced by ``attributes/<name>`` (dolma substitutes the same
    component)."""
    head, sep, path = doc_path.rpartition("://")
    parts = path.split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "documents":
            return head + sep + "/".join([*parts[:i], "attributes", name, *parts[i + 1 :]])
    raise FormatError(
        "the document path has no 'documents' component, so its attributes have no place; "
        "keep document files under <dataset>/documents/",
        path=doc_path,
    )


# ---------------------------------------------------------------------------------------------
# Decoders: incremental, multi-member aware, copyable where the codec allows it (gzip, plain),
# which is what lets the reader restart decoding in the middle of a compressed file.


class _Plain:
    def decompress(self, data: bytes) -> bytes:
        return data

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

    def flush(self) -> bytes:
        return b""

    def copy(self) -> _Plain:
        return self


# gzip and zstd agree: a compressed file of zero bytes is not an empty stream (that has a
# header) but a file cut short, so both are errors rather than zero documents
EMPTY_COMPRESSED = (
    "the file is empty, but even a compressed file of no documents has a header (a copy or a "
    "write cut short?); delete it if it should hold nothing"
)


class _Gzip:
    """zlib in gzip mode that continues over concatenated members (``cat a.gz b.gz``)."""

    def __init__(self, obj: Any = None, started: bool = False) -> None:
        self.obj = obj if obj is not None else zlib.decompressobj(wbits=31)
        self.started = started

    def decompress(self, data: bytes) -> bytes:
        self.started = self.started or bool(data)
        out = [self.obj.decompress(data)]
        while self.obj.eof and self.obj.unused_data:
            rest = self.obj.unused_data
            self.obj = zlib.decompressobj(wbits=31)
            out.append(self.obj.decompress(rest))
        return b"".join(out)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The output of ``data`` in pieces of at most OUT_PIECE bytes (all input consumed)."""
        self.started = self.started or bool(data)
        while data:
            out = self.obj.decompress(data, OUT_PIECE)
            if out:
                yield out
            if self.obj.unconsumed_tail:
                data = self.obj.unconsumed_tail
            elif self.obj.eof and self.obj.unused_data:
                data = self.obj.unused_data
                self.obj = zlib.decompressobj(wbits=31)
            else:
                data = b""

    def flush(self) -> bytes:
        if not self.started:
            raise ValueError(EMPTY_COMPRESSED)
        if not self.obj.eof and self.obj.unconsumed_tail == b"":
            tail = self.obj.flush()
            if not self.obj.eof:
                raise zlib.error("compressed stream ends early (truncated gzip file)")
            return tail
        return b""

    def copy(self) -> _Gzip:
        return _Gzip(self.obj.copy(), self.started)


class _Zstd:
    """zstandard that continues over concatenated frames; it cannot be copied."""

    def __init__(self) -> None:
        import zstandard

        self._dctx = zstandard.ZstdDecompressor()
        self.obj = self._dctx.decompressobj()
        self.started = False

    def decompress(self, data: bytes) -> bytes:
        out = [self.obj.decompress(data)] if data else []
        self.started = self.started or bool(data)
        while self.obj.eof and self.obj.unused_data:
            rest = self.obj.unused_data
            self.obj = self._dctx.decompressobj()
            out.append(self.obj.decompress(rest))
        return b"".join(out)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The output of ``data``, fed in small slices so that no piece is huge."""
        view = memoryview(data)
        for i in range(0, len(view), _ZSTD_SLICE):
            out = self.decompress(view[i : i + _ZSTD_SLICE])
            if out:
                yield out

    def flush(self) -> bytes:
        if not self.started:
            raise ValueError(EMPTY_COMPRESSED)
        if not self.obj.eof:
            raise ValueError("compressed stream ends early (truncated zstd file)")
        return b""

    def copy(self) -> None:
        return None


def _decode_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    return (zlib.error, EOFError, ValueError, zstandard.ZstdError)


DECODE_ERRORS = _decode_errors()


def new_decoder(codec: str) -> _Plain | _Gzip | _Zstd:
    if codec == "gz":
        return _Gzip()
    if codec == "zst":
        return _Zstd()
    return _Plain()


def line_too_long(
    path: str | os.PathLike[str], lineno: int, max_line_bytes: int
) -> CorruptDataError:
    return CorruptDataError(
        f"line is longer than max_line_bytes={max_line_bytes} bytes (a decompression bomb, or "
        "not JSONL); if the file is genuine, read it with a larger max_line_bytes",
        path=path,
        position=f"line {lineno}",
    )


class LineSplitter:
    """Cuts decoded pieces into lines. The unfinished line is kept as a list of pieces, so a
    long line costs one copy in all (not one per piece), and it is refused as soon as it
    grows past ``max_line_bytes``, before it is held whole."""

    def __init__(self, path: str | os.PathLike[str], lineno: int, max_line_bytes: int) -> None:
        self.path = path
        self.lineno = lineno  # number of the line the pending pieces start
        self.max_line_bytes = max_line_bytes
        self._parts: list[bytes] = []
        self.pending = 0  # bytes of the unfinished line

    def feed(self, out: bytes) -> list[bytes]:
        """The lines that ``out`` completes (without their newlines)."""
        if b"\n" not in out:
            self.pending += len(out)
            if self.pending > self.max_line_bytes:
                raise line_too_long(self.path, self.lineno, self.max_line_bytes)
            if out:
                self._parts.append(out)
            return []
        lines = out.split(b"\n")
        rest = lines.pop()
        if self._parts:
            if self.pending + len(lines[0]) > self.max_line_bytes:
                raise line_too_long(self.path, self.lineno, self.max_line_bytes)
            self._parts.append(lines[0])
            lines[0] = b"".join(self._parts)
        if len(out) > self.max_line_bytes:
            for k, ln in enumerate(lines):
                if len(ln) > self.max_line_bytes:
                    raise line_too_long(self.path, self.lineno + k, self.max_line_bytes)
        self.lineno += len(lines)
        self._parts = [rest] if rest else []
        self.pending = len(rest)
        if self.pending > self.max_line_bytes:
            raise line_too_long(self.path, self.lineno, self.max_line_bytes)
        return lines

    def carry(self) -> bytes:
        """The unfinished line so far."""
        if len(self._parts) > 1:
            self._parts = [b"".join(self._parts)]
        return self._parts[0] if self._parts else b""


def read_chunks(store: Store, key: str, step: int | None = None) -> Iterator[bytes]:
    """The bytes of ``key`` in ranged reads of ``step`` bytes (default 1 MiB locally, 8 MiB
    from object stores); the end is where a read comes back empty (remotely: short)."""
    if step is None:
        step = READ_CHUNK if isinstance(store, LocalStore) else REMOTE_CHUNK
    off = 0
    while True:
        chunk = store.read_range(key, off, step)
        if not chunk:
            return
        yield chunk
        off += len(chunk)
        if len(chunk) < step and not isinstance(store, LocalStore):
            return  # an object store's short read is its end (saves one request)


def iter_raw_lines(
    store: Store, key: str, start_line: int = 1, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes without the newline)`` for every line of a document or attribute
    file, decoded chunk by chunk. A final line without newline counts; truncated or garbled
    compression, or a line longer than ``max_line_bytes``, is a CorruptDataError naming the
    file and line."""
    where = store.url(key)
    dec = new_decoder(codec_of(key))
    lines = LineSplitter(where, start_line, max_line_bytes)
    chunks = read_chunks(store, key)
    try:
        while True:
            chunk = next(chunks, b"")
            outs = dec.pieces(chunk) if chunk else iter([dec.flush()])
            for out in outs:
                first = lines.lineno
                for k, ln in enumerate(lines.feed(out)):
                    yield first + k, ln
            if not chunk:
                rest = lines.carry()
                if rest:
                    yield lines.lineno, rest
                return
    except CorruptDataError:
        raise
    except DECODE_ERRORS as e:
        raise CorruptDataError(
            f"cannot decompress ({e}); the file is truncated or not {codec_of(key)} data: "
            "re-create or re-download it",
            path=where,
            position=f"after line {lines.lineno - 1}",
        ) from None


def open_write(raw: BinaryIO, compression: str, level: int | None = None) -> Any:
    """A binary stream writing ``compression`` into ``raw`` (gz: mtime 0, so output is
    reproducible); closing it closes ``raw``."""
    if compression == "gz":
        return _Closing(GzipWriter(raw, 6 if level is None else level), raw)
    if compression == "zst":
        import zstandard

        w = zstandard.ZstdCompressor(level=3 if level is None else level).stream_writer(
            raw, closefd=False
        )
        return _Closing(w, raw)
    if compression in ("none", ""):
        return _Closing(None, raw)
    raw.close()
    raise FormatError(f"unknown compression {compression!r}; use gz, zst or none")


class GzipWriter:
    """One gzip member as Python's ``gzip`` writes it with ``mtime=0`` and no file name
    (header, raw deflate, CRC-32 and size), compressed with zlib-ng. Small writes (a document
    each) are gathered into blocks of ``BLOCK`` bytes: one compress call per block."""

    BLOCK = 1 << 18

    def __init__(self, raw: BinaryIO, level: int) -> None:
        self.raw = raw
        self._z = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, zlib.DEF_MEM_LEVEL, 0)
        self._crc = 0
        self._size = 0
        self._buf: list[bytes] = []
        self._pending = 0
        xfl = b"\x02" if level == 9 else b"\x04" if level == 1 else b"\x00"
        raw.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + xfl + b"\xff")

    def write(self, data: bytes) -> int:
        self._buf.append(data)
        self._pending += len(data)
        if self._pending >= self.BLOCK:
            self._compress()
        return len(data)

    def _compress(self) -> None:
        block = b"".join(self._buf)
        self._buf.clear()
        self._pending = 0
        self._crc = zlib.crc32(block, self._crc)
        self._size += len(block)
        out = self._z.compress(block)
        if out:
            self.raw.write(out)

    def close(self) -> None:
        self._compress()
        self.raw.write(self._z.flush())
        self.raw.write(struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))


class _Closing:
    """Closes the codec stream, then the file under it."""

    def __init__(self, stream: Any, raw: Any) -> None:
        self.stream = stream if stream is not None else raw
        self.raw = raw

    def write(self, data: bytes) -> int:
        return self.stream.write(data)  # type: ignore[no-any-return]

    def close(self) -> None:
        try:
            if self.stream is not self.raw:
                self.stream.close()
        finally:
            if not self.raw.closed:
                self.raw.close()

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OutputFile:
    """One output file (an attribute file, a mixed shard) written through its store: it
    appears whole on :meth:`commit` (a rename locally, one object upload remotely) and
    :meth:`abort` leaves nothing. Replaces an existing file only with ``overwrite``."""

    def __init__(self, store: Store, key: str, compression: str, *, overwrite: bool = True) -> None:
        self.key = key
        self._out = store.output(key, directory=False, overwrite=overwrite)
        try:
            self._f = open_write(self._out.open_write(""), compression)
        except BaseException:
            self._out.abort()
            raise

    def write(self, data: bytes) -> None:
        self._f.write(data)

    def commit(self) -> None:
        if self._out.done:
            return
        try:
            self._f.close()
        except BaseException:
            self._out.abort()
            raise
        self._out.commit()

    def abort(self) -> None:
        if self._out.done:
            return
        try:
            self._f.close()
        except Exception:  # discarding the output anyway
            pass
        self._out.abort()

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        if et is None:
            self.commit()
        else:
            self.abort()


def suffix_for(compression: str) -> str:
    return {"gz": ".jsonl.gz", "zst": ".jsonl.zst", "none": ".jsonl", "": ".jsonl"}[compression]
