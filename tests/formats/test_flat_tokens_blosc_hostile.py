"""Blosc chunks of flat-tokens (lmdata/formats/flat_tokens/_blosc.py and the full decode):
partial decodes equal numcodecs' full decode for every layout numcodecs writes, and corrupt,
short or lying frames give lmdata errors naming the chunk (never a raw exception or an
allocation the file cannot justify)."""

from __future__ import annotations

import json
import os
import re
import struct
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import CorruptDataError, FormatError, LmdataError
from lmdata.formats.flat_tokens import _blosc, _codecs

Blosc = numcodecs.Blosc
SHUFFLES = [Blosc.NOSHUFFLE, Blosc.SHUFFLE, Blosc.BITSHUFFLE, Blosc.AUTOSHUFFLE]
CNAMES = ["lz4", "lz4hc", "zstd", "blosclz", "zlib"]


def items(n: int, typesize: int, seed: int) -> np.ndarray:
    """``n`` items of ``typesize`` bytes with runs (streams both compressed and stored)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, typesize), dtype=np.uint8)
    raw[:, typesize // 2 :] = 0  # high bytes zero, as token ids have
    raw[rng.random(n) < 0.3] = 7
    return np.ascontiguousarray(raw).view(f"V{typesize}").reshape(n)


def check_partial(buf: bytes, typesize: int, ranges: list[tuple[int, int]]) -> int:
    """Partial reads of ``ranges`` equal numcodecs' full decode; the ranges read."""
    full = np.frombuffer(Blosc().decode(buf), np.uint8)
    f = _blosc.parse(buf, typesize, len(full))
    if f is None:
        return 0
    out, planes, done = np.zeros(f.nbytes, np.uint8), {}, 0
    for lo, hi in ranges:
        if _blosc.can_read(f, lo, hi):
            _blosc.read_into(buf, f, lo, hi, out, planes)
            a, b = lo * typesize, hi * typesize
            np.testing.assert_array_equal(out[a:b], full[a:b])
            done += 1
    return done


@settings(max_examples=200, deadline=None)
@given(
    nbytes=st.integers(1, 1 << 20),
    typesize=st.sampled_from([1, 2, 4, 8, 16, 32]),
    cname=st.sampled_from(CNAMES),
    clevel=st.sampled_from([0, 1, 5, 9]),
    shuffle=st.sampled_from(SHUFFLES),
    blocksize=st.sampled_from([0, 1024, 4096, 12288, 65536]),
    cuts=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 3000)), min_size=1, max_size=4),
    seed=st.integers(0, 3),
)
def test_partial_equals_numcodecs_full_decode(
    nbytes, typesize, cname, clevel, shuffle, blocksize, cuts, seed
) -> None:
    """Every layout numcodecs writes: read in part (lz4 streams of shuffled items), or left
    to the full decode (parse gives None)."""
    n = max(1, nbytes // typesize)
    buf = bytes(Blosc(cname, clevel, shuffle, blocksize).encode(items(n, typesize, seed)))
    ranges = [(min(int(c * n), n - 1), min(n, int(c * n) + k)) for c, k in cuts]
    check_partial(buf, typesize, ranges)


@settings(max_examples=80, deadline=None)
@given(
    nbytes=st.integers(1 << 17, 1 << 20),
    typesize=st.sampled_from([1, 2, 4, 8, 16]),
    cname=st.sampled_from(["lz4", "lz4hc"]),
    clevel=st.integers(1, 9),
    shuffle=st.sampled_from([Blosc.SHUFFLE, Blosc.BITSHUFFLE, Blosc.AUTOSHUFFLE]),
    blocksize=st.sampled_from([0, 4096, 8192, 16384]),
    cuts=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 40_000)), min_size=1, max_size=6),
    seed=st.integers(0, 3),
)
def test_lz4_frames_are_read_in_part_as_numcodecs_decodes_them(
    nbytes, typesize, cname, clevel, shuffle, blocksize, cuts, seed
) -> None:
    """The layouts read in part: taken for every frame of several blocks, and equal to the
    full decode over ranges across blocks, read with blocks kept between them."""
    n = nbytes // typesize
    buf = bytes(Blosc(cname, clevel, shuffle, blocksize).encode(items(n, typesize, seed)))
    f = _blosc.parse(buf, typesize, n * typesize)
    event("whole" if f is None else "in part")
    if f is None:  # only a frame of one block (nothing to read in part) is left whole
        assert struct.unpack_from("<I", buf, 8)[0] >= n * typesize
        return
    ranges = [(min(int(c * n), n - 1), min(n, int(c * n) + k)) for c, k in cuts]
    ranges.append((0, min(n, f.blocksize // typesize)))  # the first block: always whole
    assert check_partial(buf, typesize, ranges) >= 1


@pytest.mark.parametrize("cname", ["lz4", "lz4hc"])
@pytest.mark.parametrize("shuffle", [Blosc.SHUFFLE, Blosc.BITSHUFFLE])
@pytest.mark.parametrize("typesize", [1, 2, 4, 8, 16])
def test_partial_reads_at_block_boundaries(cname, shuffle, typesize) -> None:
    """The ranges where off-by-ones hide: a block's first and last items, a range ending
    exactly on a block boundary, one across blocks, the last whole block's end (the frame
    ends on a boundary), and the short last block of another frame (left to a full decode)."""
    per = 65536 // typesize  # items per block (c-blosc makes a split block 64 KiB at least:
    for n in (8 * per, 8 * per + 40):  # a block size asked for is multiplied by the typesize)
        buf = bytes(Blosc(cname, 5, shuffle, per).encode(items(n, typesize, 1)))
        f = _blosc.parse(buf, typesize, n * typesize)
        assert f is not None and not f.memcpyed and f.blocksize == 65536
        ranges = [(0, 1), (per - 1, per), (per, per + 1), (per, 2 * per), (3, per)]
        ranges += [(per - 3, 3 * per + 5), (7 * per, 8 * per), (8 * per - 1, 8 * per)]
        assert check_partial(buf, typesize, ranges) == len(ranges)
        assert _blosc.can_read(f, n - 1, n) == (n == 8 * per)


def test_typesize_past_max_splits_is_left_to_full_decode() -> None:
    """c-blosc keeps a block of items over 16 bytes in one stream, split flag or not: such a
    frame (numcodecs sets the flag, a hand-made one may not) is not read as 32 streams."""
    buf = bytearray(Blosc("lz4", 5, Blosc.SHUFFLE).encode(items(40_000, 32, 0)))
    buf[2] &= ~0x10  # the "not split" flag cleared
    assert Blosc().decode(bytes(buf)) == bytes(items(40_000, 32, 0))
    assert _blosc.parse(bytes(buf), 32, 40_000 * 32) is None


# ---- lying headers: refused before anything is allocated ------------------------------------


def lying(nbytes: int, memcpyed: bool = False, n: int = 100) -> bytes:
    buf = bytearray(Blosc("lz4", 5, Blosc.SHUFFLE).encode(np.arange(3000, dtype=np.uint32)))
    buf = buf[:n]
    buf[2] = buf[2] | 0x2 if memcpyed else buf[2] & ~0x2
    struct.pack_into("<III", buf, 4, nbytes, 4096, n)
    return bytes(buf)


@pytest.mark.parametrize("memcpyed", [False, True])
def test_a_small_frame_declaring_a_huge_chunk_allocates_nothing(memcpyed) -> None:
    limit = 64 << 20  # the chunk's declared size allows it; the frame's 100 bytes do not
    buf = lying(limit, memcpyed)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="declares"):
            _codecs._bounded_decompress("blosc", Blosc(), buf, limit)
        with pytest.raises(ValueError, match="declares"):
            _blosc.parse(buf, 4, limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_lying_chunk_names_itself_through_the_reader(tmp_path) -> None:
    from lmdata.formats.flat_tokens import Writer

    p = tmp_path / "d.zarr"
    with Writer(p, chunk_tokens=1 << 22, compression="blosc", manifest=False) as w:  # 16 MiB chunks
        w.write(np.arange(1, 5000, dtype=np.uint32))
    f = p / "train" / "encoded_tokens" / "0"
    f.write_bytes(lying(16 << 20))
    r = lmdata.open(p, cache_bytes=0)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDataError, match="more than any codec expands") as e:
            r.span(0, 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.position == "chunk 0" and e.value.path == str(f)
    assert peak < 4 << 20


# ---- zarr v3: the bytes codec's byte order -----------------------------------------------------


def test_v3_big_endian_blosc_rows_are_not_read_as_little_endian(tmp_path) -> None:
    """A v3 array stored big-endian under Blosc: rows read from blocks must be swapped like
    the full decode's (they came back byte-swapped: the partial path took the stored bytes)."""
    zarr = pytest.importorskip("zarr")
    from zarr.codecs import BloscCodec, BytesCodec

    from lmdata.formats.flat_tokens._windows import copy_windows
    from lmdata.formats.flat_tokens._zarr import ZArray
    from lmdata.storage import resolve

    n = 1 << 21  # two 4 MiB chunks of eight 512 KiB blocks
    a = np.random.default_rng(0).integers(1, 50_000, n, dtype=np.uint32)
    for endian in ("big", "little"):
        p = tmp_path / f"{endian}.zarr"
        z = zarr.create_array(
            str(p),
            shape=(n,),
            chunks=(n // 2,),
            dtype="uint32",
            serializer=BytesCodec(endian=endian),
            compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")],
            zarr_format=3,
        )
        z[:] = a
        arr = ZArray(*resolve(str(p), None), cache_bytes=0)
        assert arr.meta.codecs == ("bytes(big), blosc" if endian == "big" else "blosc")
        starts = np.array([1000, n // 2 + 70_000], dtype=np.int64)
        got = copy_windows(arr, starts, 64, None)
        np.testing.assert_array_equal(got, np.stack([a[s : s + 64] for s in starts]))


def _array(p: Path, codecs: list, v2: dict | None = None, **extra: Any) -> Any:
    from lmdata.formats.flat_tokens._zarr import ZArray
    from lmdata.storage import resolve

    p.mkdir()
    if v2 is not None:
        meta = {"zarr_format": 2, "shape": [8], "chunks": [8], "dtype": "<u4", **v2}
        (p / ".zarray").write_text(json.dumps({"fill_value": 0, "order": "C", **meta}))
    else:
        grid = {"name": "regular", "configuration": {"chunk_shape": [8]}}
        meta = {"zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "uint32"}
        meta |= {"chunk_grid": grid, "fill_value": 0, "codecs": codecs, **extra}
        (p / "zarr.json").write_text(json.dumps(meta))
    return ZArray(*resolve(str(p), None))


@pytest.mark.parametrize(
    "codecs, v2, message",
    [
        ([{"name": "bytes", "configuration": {"endian": "middle"}}], None, "endian 'middle'"),
        ([{"name": "bytes"}, {"name": "lzfoo"}], None, "unsupported zarr v3 codec 'lzfoo'"),
        ([7], None, "bad codec entry 7"),
        ([], {"compressor": None, "filters": {"id": "delta"}}, "'filters' must be a list"),
        ([], {"compressor": "blosc", "filters": None}, "'compressor' must be an object"),
    ],
)
def test_unsupported_codecs_say_what_and_where(tmp_path, codecs, v2, message) -> None:
    """(These raised TypeError inside the metadata checks, reported as 'malformed zarr
    metadata (TypeError: unsupported operand type(s) for /)', not what was wrong.)"""
    with pytest.raises(FormatError, match=re.escape(message)) as e:
        _array(tmp_path / "a.zarr", codecs, v2)
    assert e.value.path == str(tmp_path / "a.zarr" / ("zarr.json" if v2 is None else ".zarray"))


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"chunk_key_encoding": {"name": "flat"}}, "unsupported chunk_key_encoding"),
        (
            {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "-"}}},
            "unsupported chunk_key_encoding",
        ),
        ({"index_location": 0}, "index_location 0"),
    ],
)
def test_layouts_read_otherwise_are_refused(tmp_path, extra, message) -> None:
    """Metadata this reader would read as another layout (every chunk missing: all fill
    values; a shard index looked for at the wrong end) is a FormatError, not wrong items."""
    codecs, extra = [{"name": "bytes"}], dict(extra)
    if "index_location" in extra:
        conf = {"chunk_shape": [4], "index_location": extra.pop("index_location")}
        codecs = [{"name": "sharding_indexed", "configuration": conf}]
    with pytest.raises(FormatError, match=re.escape(message)):
        _array(tmp_path / "a.zarr", codecs, **extra)


@pytest.mark.parametrize("name, sep, key", [("default", "/", "c/0"), ("default", ".", "c.0")])
def test_chunk_key_encodings_read(tmp_path, name, sep, key) -> None:
    enc = {"name": name, "configuration": {"separator": sep}}
    p = tmp_path / "a.zarr"
    arr = _array(p, [{"name": "bytes"}], chunk_key_encoding=enc)
    (p / key).parent.mkdir(exist_ok=True)
    (p / key).write_bytes(np.arange(8, dtype="<u4").tobytes())
    assert arr.read(0, 8).tolist() == list(range(8))
    v2 = _array(tmp_path / "b.zarr", [{"name": "bytes"}], chunk_key_encoding={"name": "v2"})
    (tmp_path / "b.zarr" / "0").write_bytes(np.arange(8, dtype="<u4").tobytes())
    assert v2.read(2, 5).tolist() == [2, 3, 4]


# ---- threads ---------------------------------------------------------------------------------


class _Frames:
    """A store of one small valid frame under any key (the frame cache's churn, no files)."""

    can_mmap = True

    def __init__(self) -> None:
        self.buf = bytes(Blosc("lz4", 5, Blosc.SHUFFLE).encode(np.arange(16, dtype=np.uint32)))

    def mmap(self, key: str) -> bytes:
        return self.buf


class _Slow(dict):
    """A dict that lets other threads run after making an iterator and after a removal, as
    they may at any point between two calls on a plain dict."""

    def __iter__(self):
        it = super().__iter__()
        time.sleep(0.001)
        return it

    def pop(self, *args):
        got = super().pop(*args)
        time.sleep(0.001)
        return got


def test_the_frame_cache_evicts_safely_under_threads() -> None:
    """Evicting from the frame cache while another thread inserted raised 'dictionary
    changed size during iteration' (reported as a corrupt chunk)."""
    p = _blosc.Partial(_Frames(), 4, 64)
    p._frames = _Slow()
    errors: list[BaseException] = []

    def churn(t: int) -> None:
        try:
            for i in range(100):
                p._frame(f"{t}/{i}")
        except BaseException as e:  # (any exception is the failure)
            errors.append(e)

    ts = [threading.Thread(target=churn, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert len(p._frames) <= 64


def test_the_partial_read_accounting_forgets_chunks_the_frame_cache_let_go() -> None:
    """Each chunk read in part once kept its count of blocks spent for good: random reads over
    a large dataset grew it by one entry per chunk, without bound."""
    store = _Frames()
    chunk = np.random.default_rng(0).integers(0, 1000, CHUNK, dtype=np.uint32)
    store.buf = bytes(Blosc("lz4", 5, Blosc.BITSHUFFLE, 16384).encode(chunk))
    p = _blosc.Partial(store, 4, CHUNK * 4)
    for i in range(200):
        got = p.read(f"c/{i}", [(5, 9)], 9)
        assert got is not None and got[20:36].view(np.uint32).tolist() == chunk[5:9].tolist()
    assert len(p._frames) <= 64 and set(p._spent) <= set(p._frames)


# ---- corrupt chunks through the reader ---------------------------------------------------------

# 512 KiB chunks of eight 64 KiB blocks (c-blosc multiplies the block size asked for by the
# typesize, and makes a split block 64 KiB at least: the 4096 asked for before gave 64 KiB
# chunks of one block, never read in part)
CHUNK, ROW = 1 << 17, 512


@pytest.fixture(scope="module")
def small_blocks(tmp_path_factory) -> tuple[Path, np.ndarray, dict[int, bytes]]:
    """A flat-tokens dataset whose Blosc chunks have small blocks (read in part), and its
    pristine chunk files."""
    from lmdata.formats.flat_tokens import Writer

    p = tmp_path_factory.mktemp("hostile") / "d.zarr"
    toks = np.random.default_rng(0).integers(1, 50_257, 3 * CHUNK - 300, dtype=np.uint32)
    with Writer(p, chunk_tokens=CHUNK, compression="blosc", manifest=False) as w:
        w.write(toks)
    enc = lmdata.open(p).span_encoded(0, len(toks))
    d = p / "train" / "encoded_tokens"
    codec = Blosc("lz4", 5, Blosc.BITSHUFFLE, 16384)
    orig = {}
    for k in range(3):
        chunk = np.zeros(CHUNK, np.uint32)
        part = enc[k * CHUNK : (k + 1) * CHUNK]
        chunk[: len(part)] = part
        orig[k] = bytes(codec.encode(chunk))
        (d / str(k)).write_bytes(orig[k])
    return p, enc, orig


def _corrupt(data, buf: bytes) -> bytes:
    b = bytearray(buf)
    nblocks = -(-struct.unpack_from("<I", b, 4)[0] // max(1, struct.unpack_from("<I", b, 8)[0]))
    table = 16 + 4 * min(nblocks, 64)
    streams = [struct.unpack_from("<I", buf, 16 + 4 * j)[0] for j in range(min(nblocks, 64))]
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.sampled_from(["header", "table", "stream", "anywhere", "anywhere"]))
        if where == "header":
            at = data.draw(st.integers(0, 15))
        elif where == "table":
            at = data.draw(st.integers(16, table - 1))
        elif where == "stream":  # a stream's size or first bytes
            at = min(len(b) - 1, data.draw(st.sampled_from(streams)) + data.draw(st.integers(0, 7)))
        else:
            at = data.draw(st.integers(0, len(b) - 1))
        b[at] = data.draw(st.integers(0, 255))
    if data.draw(st.integers(0, 3)) == 0:
        b = b[: data.draw(st.integers(0, len(b)))]
    if len(b) >= 16 and data.draw(st.booleans()):
        struct.pack_into("<I", b, 12, len(b))  # the size agrees: the checks go deeper
    return bytes(b)


@settings(
    max_examples=150,  # (four reads each, a 512 KiB chunk decoded by some: the file's slowest)
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_corrupt_chunks_give_only_lmdata_errors_naming_them(small_blocks, data) -> None:
    """A chunk's bytes overwritten or cut: every read either returns rows (those of other
    chunks right) or raises an lmdata error naming the chunk's file and number, on the
    partial path (one row of a chunk) and the full one (spans, many rows)."""
    p, enc, orig = small_blocks
    k = data.draw(st.integers(0, 2))
    f = p / "train" / "encoded_tokens" / str(k)
    tmp = f.with_name("tmp")
    tmp.write_bytes(_corrupt(data, orig[k]))
    os.replace(tmp, f)  # (a new file: no map of the old one sees it change)
    try:
        rows = enc[: len(enc) // ROW * ROW].reshape(-1, ROW)
        per = CHUNK // ROW
        mine = [r for r in range(k * per, (k + 1) * per) if r < len(rows)]
        r = lmdata.open(p, cache_bytes=0)
        reads = [
            lambda: r.packed_rows(np.array([data.draw(st.sampled_from(mine))]), ROW),
            lambda: r.encoded_windows(np.array([k * CHUNK + data.draw(st.integers(0, 99))]), 300),
            lambda: r.packed_rows(np.array(mine[:4]), ROW),
            lambda: r.span_encoded(k * CHUNK, min(len(enc), (k + 1) * CHUNK)),
        ]
        for i, read in enumerate(reads):
            try:
                read()
                event(f"read {i}: rows")
            except LmdataError as e:
                event(f"read {i}: {type(e).__name__}")
                assert e.path == str(f), e
                assert e.position == f"chunk {k}", e
        other = [x for x in (0, per + 1, 2 * per + 2) if x // per != k]
        np.testing.assert_array_equal(r.packed_rows(np.array(other), ROW), rows[other])
        r.close()
    finally:
        tmp.write_bytes(orig[k])
        os.replace(tmp, f)


# ---- only bad bytes are corrupt data -----------------------------------------------------------


def _boom(exc: type[BaseException]) -> Any:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise exc("not the file's fault")

    return boom


@pytest.mark.native
@pytest.mark.parametrize(
    "where, exc",
    [
        ("_unshuffle", IndexError),  # a slip in our own slicing
        ("_unshuffle", TypeError),
        ("_block", MemoryError),  # a block's streams could not be allocated
        ("_frame", RuntimeError),  # as the frame cache raised under threads before its lock
        ("_decode", MemoryError),  # the full decode's output could not be allocated
        ("_decode", AttributeError),
    ],
)
def test_memory_running_out_or_a_bug_is_not_called_a_corrupt_chunk(
    small_blocks, monkeypatch, where, exc
) -> None:
    """Every exception inside a chunk's decode was reported as 'cannot decode chunk' (a
    CorruptDataError telling the user to look at the file): memory running out, or a bug of
    ours, goes through as it is; on the partial path (one row) and the full one (a span)."""
    from lmdata.formats.flat_tokens import _windows

    if where != "_decode" and not _windows.in_c():
        pytest.skip("rows are read from a chunk's blocks only by the C lookup (lmdata._native)")
    p, _, _ = small_blocks
    r = lmdata.open(p, cache_bytes=0)
    if where == "_decode":
        monkeypatch.setattr(r.tokens, "_decode", _boom(exc))
        read = lambda: r.span_encoded(0, CHUNK)  # noqa: E731
    else:
        target = _blosc.Partial if where == "_frame" else _blosc
        monkeypatch.setattr(target, where, _boom(exc))
        read = lambda: r.packed_rows(np.array([1]), ROW)  # noqa: E731
    with pytest.raises(exc, match="not the file's fault"):
        read()
    r.close()


def _encoded(comp: dict | None, filters: list[dict], a: np.ndarray) -> bytes:
    data: Any = a
    for f in filters:
        data = numcodecs.get_codec(f).encode(data)
    data = np.ascontiguousarray(data).tobytes()
    return bytes(numcodecs.get_codec(comp).encode(data)) if comp else data


CODEC_CHAINS = [
    ({"id": "blosc", "cname": "lz4", "shuffle": 2, "blocksize": 1024}, []),
    ({"id": "blosc", "cname": "zstd", "shuffle": 1}, []),
    ({"id": "blosc", "cname": "zlib", "shuffle": 0}, []),
    ({"id": "zstd"}, []),
    ({"id": "gzip"}, []),
    ({"id": "zlib"}, []),
    ({"id": "bz2"}, []),
    ({"id": "lzma"}, []),
    ({"id": "lz4"}, []),
    ({"id": "zlib"}, [{"id": "shuffle", "elementsize": 4}]),
    ({"id": "zstd"}, [{"id": "delta", "dtype": "<u4"}]),
    (None, [{"id": "crc32"}]),
    (None, [{"id": "adler32"}]),
    (None, [{"id": "fletcher32"}]),
    (None, [{"id": "astype", "encode_dtype": "<u2", "decode_dtype": "<u4"}]),
]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_codec_refuses_bad_bytes_with_one_exception(data) -> None:
    """Whatever the codec library raises on bytes it cannot decode (RuntimeError, zlib.error,
    LZMAError, ZstdError, bz2's OSError...) comes out of a chunk decoder as BadChunk, the one
    exception the reader reports as a corrupt chunk (it reports nothing else as one)."""
    comp, filters = data.draw(st.sampled_from(CODEC_CHAINS))
    n = 2048
    a = (np.arange(n, dtype="<u4") * 2654435761 % 977).astype("<u4")
    decode, _ = _codecs.v2_decoder({"compressor": comp, "filters": filters}, a.dtype, n, "x")
    assert decode is not None
    b = bytearray(_encoded(comp, filters, a))
    assert bytes(decode(bytes(b))) == a.tobytes()
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(b) - 1))
        b[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        b = b[: data.draw(st.integers(0, len(b)))]
    try:
        decode(bytes(b))
        event("decoded")
    except _blosc.BadChunk as e:
        event(f"BadChunk from {type(e.__cause__).__name__}")


@pytest.mark.parametrize(
    "codecs",
    [
        [{"name": "bytes", "configuration": {"endian": "big"}}],
        [{"name": "numcodecs.delta", "configuration": {"dtype": "<u4"}}, {"name": "bytes"}],
    ],
)
def test_v3_chunks_of_a_part_item_are_bad_chunks(codecs) -> None:
    """A v3 chunk decoding to bytes that are not whole items: BadChunk (numpy's ValueError
    was caught with every other exception before)."""
    decode, _, _ = _codecs.v3_decoder(codecs, np.dtype("<u4"), 8, "x")
    assert decode is not None
    assert decode(b"\x00" * 32).tolist() == [0] * 32
    with pytest.raises(_blosc.BadChunk, match="31 bytes, not whole 4-byte items"):
        decode(b"\x00" * 31)


def test_a_shard_without_its_index_is_said_once(tmp_path) -> None:
    """A shard shorter than its index was reported as 'bad shard index: <file>: shard 0...:
    shard file ... has no full index' (our own CorruptDataError, a ValueError, caught and
    wrapped again); a checksum that does not match is a bad index."""
    pytest.importorskip("google_crc32c")
    conf = {"chunk_shape": [4], "codecs": [{"name": "bytes"}]}
    conf["index_codecs"] = [{"name": "bytes"}, {"name": "crc32c"}]
    p = tmp_path / "a.zarr"
    arr = _array(p, [{"name": "sharding_indexed", "configuration": conf}])
    (p / "c").mkdir()
    f = p / "c" / "0"
    for size, message in [
        (10, "shard file of 10 bytes has no full index"),
        (100, "bad shard index: crc32c checksum mismatch"),
    ]:
        f.write_bytes(b"\0" * size)
        arr.close()
        arr.store.forget()  # the shard was rewritten in place: not the file the store pinned
        with pytest.raises(CorruptDataError) as e:
            arr.read(0, 8)
        assert str(e.value) == f"{f}: shard 0, inner chunk 0: {message}"
