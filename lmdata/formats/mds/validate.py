"""``lmdata validate`` for streaming datasets: every file, hash, offset and sample.

On object stores: one listing per directory, then one whole read per shard file, no request
to ask a size or whether a file exists. Checks, per shard: the files exist with the sizes
index.json declares; every recorded hash (raw hashes over the uncompressed bytes, zip hashes
over the compressed file); the header's sample count and config; that the offsets start after
the header, never decrease and end at the file size; and that every sample decodes. Each
problem names the shard and the sample.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from lmdata import _json
from lmdata._progress import OnProgress, Ticker
from lmdata._report import MAX_REPORTED, ProblemReport
from lmdata.errors import LmdataError
from lmdata.formats.mds import compression as comp
from lmdata.formats.mds.hashing import hexdigest, is_hash
from lmdata.formats.mds.index import FileInfo, Index, Shard, find_index, load_index
from lmdata.formats.mds.reader import file_sizes, make_decoder
from lmdata.storage import resolve


class _ShardReport:
    """Problems of one shard, each as ``<shard data file>: shard N[ sample J]: what``, the
    way reader errors name file and position; kept in the shared report, capped per shard."""

    def __init__(self, report: ProblemReport, s: Shard, file: str) -> None:
        self.report, self.s, self.file = report, s, file

    def add(self, msg: str, sample: int | None = None) -> None:
        where = f"shard {self.s.number}" + (f" sample {sample}" if sample is not None else "")
        self.report.add(f"{self.file}: shard {self.s.number}", f"{self.file}: {where}: {msg}")


def _check_hashes(rep: _ShardReport, s: Shard, info: FileInfo, data: bytes, what: str) -> None:
    for algo in s.hashes:
        if algo not in info.hashes:
            rep.add(f"{what} {info.basename} has no {algo} hash though the shard lists {algo}")
    for algo, want in info.hashes.items():
        if not is_hash(algo):
            rep.add(f"{what} {info.basename}: unknown hash algorithm {algo!r}")
            continue
        got = hexdigest(algo, data)
        if got != want:
            rep.add(
                f"{what} {info.basename}: {algo} is {got}, index.json says {want} "
                "(the file changed or is corrupt)"
            )


def _fetch(index: Index, key: str, sizes: dict[str, int]) -> bytes | None:
    """The whole object ``key`` in one read (its size from the listing: no request to ask
    it), or None when the listing has no such file."""
    size = sizes.get(key)
    if size is None:
        return None
    return index.store.read_range(key, 0, size) if size else b""


def _load(
    index: Index,
    rep: _ShardReport,
    s: Shard,
    raw: FileInfo,
    zipped: FileInfo | None,
    what: str,
    sizes: dict[str, int],
) -> bytes | None:
    """The uncompressed bytes of one shard file, checking sizes and hashes on the way: one
    read per file present (``sizes``, from one listing per directory, says which are)."""
    data = _fetch(index, index.file(raw), sizes)
    if data is not None:
        if len(data) != raw.bytes:
            rep.add(f"{what} {raw.basename} is {len(data)} bytes, index.json says {raw.bytes}")
        _check_hashes(rep, s, raw, data, what)
    blob = _fetch(index, index.file(zipped), sizes) if zipped is not None else None
    if zipped is not None and blob is not None:
        if len(blob) != zipped.bytes:
            rep.add(
                f"{what} {zipped.basename} is {len(blob)} bytes, index.json says {zipped.bytes}"
            )
        _check_hashes(rep, s, zipped, blob, f"compressed {what}")
        try:
            family = comp.family_of(s.compression)
            if family is None:
                raise ValueError("zip_data is set but compression is null")
            unzipped = comp.decompress(family, blob, raw.bytes)
        except Exception as e:  # any decoder failure is a corrupt file
            rep.add(f"{what} {zipped.basename}: cannot decompress: {e}")
            return data
        if data is None:
            if len(unzipped) != raw.bytes:
                rep.add(
                    f"{what} {zipped.basename} decompresses to {len(unzipped)} bytes, "
                    f"index.json says {raw.bytes}"
                )
            _check_hashes(rep, s, raw, unzipped, what)
            data = unzipped
        elif unzipped != data:
            rep.add(f"{what} {zipped.basename} does not decompress to {raw.basename}")
    if data is None:
        name = raw.basename + (f" or {zipped.basename}" if zipped else "")
        rep.add(f"{what} file {name} is missing")
    return data


def _offsets(rep: _ShardReport, s: Shard, table: bytes, what: str) -> np.ndarray | None:
    n = s.samples
    if len(table) < 4 + 4 * (n + 1):
        rep.add(f"{what} of {len(table)} bytes cannot hold the offsets of {n} samples")
        return None
    (found,) = struct.unpack_from("<I", table)
    if found != n:
        rep.add(f"{what} header says {found} samples, index.json says {n}")
        return None
    return np.frombuffer(table, "<u4", n + 1, 4).astype(np.int64)


def _check_config(rep: _ShardReport, s: Shard, text: bytes) -> None:
    try:
        cfg = _json.parse(text, _json.MAX_METADATA_DEPTH)
    except ValueError as e:
        rep.add(f"the config embedded in the shard is not JSON: {e}")
        return
    if not isinstance(cfg, dict):
        rep.add("the config embedded in the shard is not a JSON object")
        return
    if s.format == "json":
        if cfg.get("columns") != s.columns:
            rep.add("the shard's embedded columns differ from index.json")
        return
    for key, want in (
        ("column_names", list(s.column_names)),
        ("column_encodings", list(s.column_encodings)),
    ):
        if cfg.get(key) != want:
            rep.add(f"the shard's embedded {key} {cfg.get(key)!r} differ from index.json {want!r}")


def _check_shard(
    index: Index, s: Shard, rep: _ShardReport, allow_unsafe_pickle: bool, sizes: dict[str, int]
) -> None:
    data = _load(index, rep, s, s.raw_data, s.zip_data, "data", sizes)
    table = data
    if s.split:
        assert s.raw_meta is not None
        table = _load(index, rep, s, s.raw_meta, s.zip_meta, "meta", sizes)
    if data is None or table is None:
        return
    offs = _offsets(rep, s, table, "meta file" if s.split else "shard")
    if offs is None:
        return
    n = s.samples
    head = 4 + 4 * (n + 1)
    if s.format == "mds":
        _check_config(rep, s, data[head : int(offs[0])] if head <= offs[0] <= len(data) else b"")
        lo = head
    else:
        _check_config(rep, s, table[head:])
        lo = 0
        if s.format != "json":
            assert s.separator is not None and s.newline is not None
            header = (s.separator.join(s.column_names) + s.newline).encode("utf-8")
            if not data.startswith(header) or offs[0] != len(header):
                rep.add(
                    f"data file does not start with the header line {header!r} that the "
                    "offsets skip"
                )
        elif offs[0] != 0:
            rep.add(f"the first offset is {int(offs[0])}, a JSONL shard starts at 0")
    if offs[-1] != len(data):
        rep.add(f"the last offset is {int(offs[-1])} but the data is {len(data)} bytes")
    bad = np.flatnonzero(offs[1:] < offs[:-1])
    for j in bad[:MAX_REPORTED]:
        rep.add(
            f"offset {int(offs[j + 1])} is less than the one before it, {int(offs[j])}",
            sample=int(j),
        )
    if offs[0] < lo:
        rep.add(f"the first sample starts at {int(offs[0])}, inside the {lo}-byte header")
    try:
        decode = make_decoder(s, allow_unsafe_pickle)
    except ValueError as e:
        rep.add(str(e))
        return
    for j in range(n):
        a, b = int(offs[j]), int(offs[j + 1])
        if not lo <= a <= b <= len(data):
            if j not in bad:
                rep.add(f"offsets [{a}, {b}) are not a range inside the file", sample=j)
            continue
        try:
            decode(data[a:b])
        except LmdataError as e:
            rep.add(str(e), sample=j)
        except (ValueError, UnicodeDecodeError, struct.error, StopIteration) as e:
            rep.add(f"does not decode: {e}", sample=j)


def validate(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    split: str | None = None,
    allow_unsafe_pickle: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
) -> list[str]:
    """All problems found in the streaming dataset at ``path`` (empty when it is valid);
    ``progress`` counts the shards' uncompressed bytes (as index.json gives them), shard by
    shard."""
    try:
        store, key = resolve(path, storage_options)
        index = load_index(store, find_index(store, key, split))
    except LmdataError as e:
        return [str(e)]
    try:
        sizes = file_sizes(index)  # one listing per directory, not a request per file
    except (LmdataError, OSError) as e:
        return [f"{index.path}: cannot list the shard files: {e}"]
    rep = ProblemReport()
    tick = Ticker(progress, sum(shard_bytes(s) for s in index.shards), "validate")
    for s in index.shards:
        sr = _ShardReport(rep, s, index.url(s.raw_data))
        try:
            _check_shard(index, s, sr, allow_unsafe_pickle, sizes)
        except (LmdataError, OSError) as e:
            sr.add(str(e))
        tick.add(shard_bytes(s))
    return rep.finish()


def shard_bytes(s: Shard) -> int:
    """The uncompressed bytes of a shard's files, as index.json declares them."""
    return s.raw_data.bytes + (s.raw_meta.bytes if s.raw_meta is not None else 0)
