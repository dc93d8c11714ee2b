"""Files of a Dolma tree: which names are documents, where their attributes live, how to
decode them (gzip, zstd or plain, inferred from the extension as dolma does) and how to write
gzip the same way every time.
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmdata.errors import CorruptDataError, FormatError

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


def documents_dir(root: Path) -> Path:
    """The ``documents`` folder of a tree given as the tree root or as the folder itself."""
    if root.name == "documents" and root.is_dir():
        return root
    return root / "documents"


def list_documents(root: Path) -> list[Path]:
    """Every document file below ``root/documents``, sorted by relative path (input order)."""
    ddir = documents_dir(root)
    if not ddir.is_dir():
        raise FormatError(
            "not a Dolma tree: no documents/ folder (a Dolma dataset keeps its JSONL files under "
            "<dataset>/documents/)",
            path=root,
        )
    out = []
    for dirpath, dirnames, files in os.walk(ddir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out.extend(Path(dirpath) / f for f in files if is_doc_file(f))
    return sorted(out, key=lambda p: p.relative_to(ddir).as_posix())


def expand_globs(patterns: list[str] | tuple[str, ...], base: Path | None = None) -> list[Path]:
    """Document paths matching ``patterns`` (``**`` allowed), each pattern's matches sorted,
    duplicates dropped; relative patterns are taken from ``base`` (default: the cwd)."""
    seen: set[Path] = set()
    out: list[Path] = []
    for pat in patterns:
        full = pat if base is None or os.path.isabs(pat) else os.path.join(base, pat)
        matches = sorted(glob.glob(full, recursive=True))
        if not matches and not glob.has_magic(full) and os.path.isfile(full):
            matches = [full]
        for m in matches:
            p = Path(m)
            if p.is_file() and p not in seen:
                seen.add(p)
                out.append(p)
    return out


def attribute_path(doc_path: Path, name: str) -> Path:
    """Where attribute set ``name`` of a document file lives: the last ``documents`` component
    of the path replaced by ``attributes/<name>`` (dolma substitutes the same component)."""
    parts = doc_path.parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "documents":
            return Path(*parts[:i], "attributes", name, *parts[i + 1 :])
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


def line_too_long(path: Path, lineno: int, max_line_bytes: int) -> CorruptDataError:
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

    def __init__(self, path: Path, lineno: int, max_line_bytes: int) -> None:
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


def iter_raw_lines(
    path: Path, start_line: int = 1, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes without the newline)`` for every line of a document or attribute
    file, decoded in 1 MiB chunks. A final line without newline counts; truncated or garbled
    compression, or a line longer than ``max_line_bytes``, is a CorruptDataError naming the
    file and line."""
    dec = new_decoder(codec_of(path))
    lines = LineSplitter(path, start_line, max_line_bytes)
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(READ_CHUNK)
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
            f"cannot decompress ({e}); the file is truncated or not {codec_of(path)} data: "
            "re-create or re-download it",
            path=path,
            position=f"after line {lines.lineno - 1}",
        ) from None


def open_write(path: Path, compression: str, level: int | None = None) -> Any:
    """A binary file object writing ``compression`` (gz: mtime 0, so output is reproducible)."""
    if compression == "gz":
        raw = open(path, "wb")
        gz = gzip.GzipFile(
            filename="",
            mode="wb",
            fileobj=raw,
            mtime=0,
            compresslevel=6 if level is None else level,
        )
        return _Closing(gz, raw)
    if compression == "zst":
        import zstandard

        raw = open(path, "wb")
        w = zstandard.ZstdCompressor(level=3 if level is None else level).stream_writer(raw)
        return _Closing(w, raw)
    if compression in ("none", ""):
        return open(path, "wb")
    raise FormatError(f"unknown compression {compression!r}; use gz, zst or none")


class _Closing:
    """Closes the codec stream, then the file under it."""

    def __init__(self, stream: Any, raw: Any) -> None:
        self.stream = stream
        self.raw = raw

    def write(self, data: bytes) -> int:
        return self.stream.write(data)

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            if not self.raw.closed:
                self.raw.close()

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def suffix_for(compression: str) -> str:
    return {"gz": ".jsonl.gz", "zst": ".jsonl.zst", "none": ".jsonl", "": ".jsonl"}[compression]
