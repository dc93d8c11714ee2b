"""Whole-file shard compression as MosaicML streaming spells it: ``name`` or ``name:level``.

Streaming compresses each shard file as one unit and names the result ``<raw>.<family>``. We
write with the libraries in our own dependencies (zstandard, brotli, python-snappy, gzip, bz2);
streaming reads any conformant stream, so compressed bytes need not match its own exactly.
Decompression is bounded: the output may not exceed what the index declares, so a hostile
shard cannot make us allocate without limit.
"""

from __future__ import annotations

import bz2
import gzip
import zlib
from dataclasses import dataclass

from lmdata.errors import CorruptDataError, InvalidInputError

# family -> (allowed levels or None when the family has none, default level)
_FAMILIES: dict[str, tuple[range | None, int | None]] = {
    "br": (range(0, 12), 11),
    "bz2": (range(1, 10), 9),
    "gz": (range(0, 10), 9),
    "snappy": (None, None),
    "zstd": (range(1, 23), 3),
}


@dataclass(frozen=True)
class Compression:
    """A parsed compression spec; ``spec`` is the string exactly as given (it goes to disk)."""

    spec: str
    family: str
    level: int | None

    @property
    def extension(self) -> str:
        return self.family


def parse(spec: str | None) -> Compression | None:
    """``None``/empty for no compression, else the parsed spec, or InvalidInputError."""
    if not spec:
        return None
    if not isinstance(spec, str):
        raise InvalidInputError(f"compression must be a string such as 'zstd:7', got {spec!r}")
    family, sep, level_text = spec.partition(":")
    if family not in _FAMILIES:
        raise InvalidInputError(
            f"unknown compression {spec!r}; use one of {', '.join(sorted(_FAMILIES))}, "
            "optionally with :LEVEL (for example zstd:7)"
        )
    levels, default = _FAMILIES[family]
    if not sep:
        return Compression(spec, family, default)
    if levels is None:
        raise InvalidInputError(f"compression {family} has no levels; write just {family!r}")
    if not level_text.isdigit() or int(level_text) not in levels:
        raise InvalidInputError(
            f"compression level in {spec!r} must be an integer from {levels.start} to "
            f"{levels.stop - 1} (streaming spells levels without signs or leading zeros)"
        )
    if str(int(level_text)) != level_text:
        raise InvalidInputError(f"write the level of {spec!r} as {family}:{int(level_text)}")
    return Compression(spec, family, int(level_text))


def compress(c: Compression, data: bytes, *, zstd_checksum: bool = True) -> bytes:
    """``data`` compressed as ``c`` says. ``zstd_checksum=False`` writes the zstd frames
    python-zstd (streaming's library) writes, byte for byte: no checksum, and libzstd's
    multi-threaded framing (the same bytes for any number of workers)."""
    if c.family == "zstd":
        import zstandard

        if not zstd_checksum:
            return zstandard.ZstdCompressor(
                level=c.level or 3, write_content_size=True, write_checksum=False, threads=1
            ).compress(data)
        # A frame with the content size, as python-zstd writes (its decoder needs it), plus a
        # checksum python-zstd leaves out, so that damage is caught on decompression.
        return zstandard.ZstdCompressor(
            level=c.level or 3, write_content_size=True, write_checksum=True
        ).compress(data)
    if c.family == "gz":
        # mtime=0 makes our output deterministic (streaming embeds the current time).
        return gzip.compress(data, compresslevel=c.level if c.level is not None else 9, mtime=0)
    if c.family == "bz2":
        return bz2.compress(data, c.level or 9)
    if c.family == "br":
        import brotli

        return brotli.compress(data, quality=c.level if c.level is not None else 11)
    if c.family == "snappy":
        import snappy

        return snappy.compress(data)  # the raw block format, not framed
    raise AssertionError(c.family)


def _snappy_length(data: bytes) -> int:
    """The uncompressed length a raw snappy block declares (a varint preamble)."""
    n = shift = 0
    for i in range(min(len(data), 10)):
        b = data[i]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
    raise ValueError("bad snappy length preamble")


def decompress(family: str, data: bytes, limit: int) -> bytes:
    """Decompress ``data``, refusing to produce more than ``limit`` bytes.

    Raises ValueError (callers turn it into CorruptDataError with the file name).
    """
    if family == "zstd":
        import zstandard

        params = zstandard.get_frame_parameters(data)
        if params.content_size not in (zstandard.CONTENTSIZE_UNKNOWN,) and (
            params.content_size > limit
        ):
            raise ValueError(f"zstd frame declares {params.content_size} bytes, over {limit}")
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as r:
            out = r.read(limit + 1)
    elif family == "gz":
        d = zlib.decompressobj(wbits=31)
        out = d.decompress(data, limit + 1)
        if len(out) <= limit and not d.eof:
            raise ValueError("gzip stream is truncated")
    elif family == "bz2":
        d2 = bz2.BZ2Decompressor()
        out = d2.decompress(data, max_length=limit + 1)
        if len(out) <= limit and not d2.eof:
            raise ValueError("bz2 stream is truncated")
    elif family == "br":
        import brotli

        db = brotli.Decompressor()
        out = db.process(data, output_buffer_limit=limit + 1)
        if len(out) <= limit and not db.is_finished():
            raise ValueError("brotli stream is truncated")
    elif family == "snappy":
        import snappy

        if _snappy_length(data) > limit:
            raise ValueError(f"snappy block declares more than {limit} bytes")
        out = snappy.uncompress(data)
    else:
        raise ValueError(f"unknown compression {family!r}")
    if len(out) > limit:
        raise ValueError(f"decompresses to more than the {limit} bytes the index declares")
    return bytes(out)


def family_of(spec: str | None, *, path: object = None) -> str | None:
    """The family of a compression spec read from an index (CorruptDataError if unknown)."""
    if not spec:
        return None
    family = spec.partition(":")[0]
    if family not in _FAMILIES:
        raise CorruptDataError(
            f"unknown compression {spec!r} in the index; lmdata reads "
            f"{', '.join(sorted(_FAMILIES))}",
            path=path,  # type: ignore[arg-type]
        )
    return family
