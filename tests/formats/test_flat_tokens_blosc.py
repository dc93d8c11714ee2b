"""Partial Blosc decode (lmdata/formats/flat_tokens/_blosc.py) equals a full decode."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.formats.flat_tokens import _blosc


def frame(n: int, shuffle: int, blocksize: int, seed: int = 0, cname: str = "lz4") -> bytes:
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 50257, n, dtype=np.uint32)
    a[rng.random(n) < 0.3] = 7  # some runs: streams both compressed and stored as is
    c = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle, blocksize=blocksize)
    return bytes(c.encode(a))


@settings(max_examples=150, deadline=None)
@given(
    shuffle=st.sampled_from([1, 2]),
    blocksize=st.sampled_from([0, 4096, 8192, 12288, 65536]),
    whole=st.integers(1, 64),
    tail=st.floats(0, 1, exclude_max=True),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    seed=st.integers(0, 3),
)
def test_partial_equals_full(shuffle, blocksize, whole, tail, cut, seed) -> None:
    """Items lo:hi of whole blocks read in part equal a full decode. Every example is a frame
    this module takes (byte- or bit-shuffled lz4 of whole blocks, then a shorter block) and a
    range in its whole blocks: parse and can_read must say yes (no example is thrown away)."""
    # a forced blocksize of items (c-blosc keeps it when the frame holds at least one); the
    # automatic one (0) is a power of two >= 32 KiB or, for a frame shorter, all of it
    per = blocksize // 4 if blocksize else 1024
    n = min(whole * per + int(tail * per), 70_000) // 8 * 8
    buf = frame(n, shuffle, blocksize, seed)
    full = np.frombuffer(numcodecs.Blosc().decode(buf), np.uint8)
    f = _blosc.parse(buf, 4, n * 4)
    assert f is not None
    readable = n if f.memcpyed else f.nbytes // f.blocksize * (f.blocksize // 4)
    assert readable >= min(n, per)
    lo, hi = sorted(min(int(c * readable), readable - 1) for c in cut)
    hi += 1
    assert _blosc.can_read(f, lo, hi)
    out = np.zeros(n * 4, np.uint8)
    _blosc.read_into(buf, f, lo, hi, out)
    np.testing.assert_array_equal(out[lo * 4 : hi * 4], full[lo * 4 : hi * 4])


@pytest.mark.parametrize("shuffle", [1, 2])
def test_seqax_settings_every_block_and_chunk_end(shuffle) -> None:
    n = 1 << 20  # whole 512 KiB blocks, as seqax's 16 MiB chunks have
    buf = frame(n, shuffle, 0, 5)
    full = np.frombuffer(numcodecs.Blosc().decode(buf), np.uint8)
    f = _blosc.parse(buf, 4, n * 4)
    assert f is not None and not f.memcpyed
    per = f.blocksize // 4
    for lo, hi in [(0, 2048), (per - 5, per + 3), (n - 2048, n), (n - 1, n), (3, 4)]:
        out = np.zeros(n * 4, np.uint8)
        assert _blosc.can_read(f, lo, hi)
        _blosc.read_into(buf, f, lo, hi, out)
        np.testing.assert_array_equal(out[lo * 4 : hi * 4], full[lo * 4 : hi * 4])


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_corrupt_frames_fail_cleanly(data) -> None:
    """Bytes of a frame overwritten: a BadChunk, or items (never a crash or an overrun, nor
    another exception, which the reader would not report as a corrupt chunk)."""
    n = 1 << 16
    buf = bytearray(frame(n, data.draw(st.sampled_from([1, 2])), 8192, 1))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, min(len(buf) - 1, 16 + 4 * 64 + 40)))
        buf[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        buf = buf[: data.draw(st.integers(0, len(buf)))]
    lo = data.draw(st.integers(0, n - 1))
    try:
        f = _blosc.parse(bytes(buf), 4, n * 4)
        if f is None or not _blosc.can_read(f, lo, lo + 1):
            return
        _blosc.read_into(bytes(buf), f, lo, lo + 1, np.zeros(max(f.nbytes, 4), np.uint8))
    except _blosc.BadChunk:
        pass


BIG = 1 << 20  # tokens per chunk: 4 MiB, eight 512 KiB Blosc blocks


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    import lmdata
    from lmdata.formats.flat_tokens import Writer

    path = tmp_path_factory.mktemp("ftb") / "d.zarr"
    n = 3 * BIG - 777  # the last chunk ends inside a block
    toks = np.random.default_rng(0).integers(1, 50257, n, dtype=np.uint32)
    with Writer(path, chunk_tokens=BIG, compression="blosc", manifest=False) as w:
        for a in range(0, n, 100_000):
            w.write(toks[a : a + 100_000])
    return path, lmdata.open(path).span_encoded(0, n)


def _spy(r):
    full: list[int] = []
    inner = r.tokens._decode_buf
    r.tokens._decode_buf = lambda buf, need, f, pos: full.append(pos) or inner(buf, need, f, pos)
    return full


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.integers(0, (3 * BIG - 777) // 512 - 1), min_size=1, max_size=6))
def test_rows_from_partial_decodes_equal_the_tokens(big_store, rows) -> None:
    import lmdata

    path, enc = big_store
    r = lmdata.open(path, cache_bytes=0)
    full = _spy(r)
    b = np.array(rows)
    got = r.packed_rows(b, 512)
    np.testing.assert_array_equal(got, enc[: len(enc) // 512 * 512].reshape(-1, 512)[b])
    got = r.encoded_windows(b * 512 + 5, 300)
    np.testing.assert_array_equal(got, np.stack([enc[s : s + 300] for s in b * 512 + 5]))
    assert r.tokens._partial is not None
    ends = [x for x in rows if x * 512 >= 2 * BIG + 7 * (BIG // 8)]  # rows in the short block
    if len(set(rows)) == 1 and not ends:
        assert full == []  # one row of a chunk: read in part


def test_partial_reads_turn_into_a_cached_full_decode(big_store) -> None:
    import lmdata

    path, enc = big_store
    r = lmdata.open(path)
    full = _spy(r)
    per_block = (BIG // 8) // 512
    for k in range(4):  # one row in block k of chunk 0: partial reads, then a full decode
        np.testing.assert_array_equal(
            r.packed_rows(np.array([k * per_block]), 512)[0], enc[k * per_block * 512 :][:512]
        )
    assert full == ["chunk 0"]
    r.packed_rows(np.array([5 * per_block]), 512)
    assert full == ["chunk 0"]  # cached since


def test_a_corrupt_block_names_the_chunk(tmp_path, big_store) -> None:
    import shutil

    import lmdata
    from lmdata.errors import CorruptDataError

    path, _ = big_store
    p = tmp_path / "d.zarr"
    shutil.copytree(path, p)
    f = p / "train" / "encoded_tokens" / "1"
    buf = bytearray(f.read_bytes())
    start = int.from_bytes(buf[16 + 8 : 16 + 12], "little")  # block 2
    buf[start : start + 4] = (1 << 30).to_bytes(4, "little")  # a stream size past the block
    f.write_bytes(bytes(buf))
    r = lmdata.open(p, cache_bytes=0)
    with pytest.raises(CorruptDataError, match="chunk 1"):
        r.packed_rows(np.array([BIG // 512 + 2 * (BIG // 8) // 512]), 512)


def test_threads_reading_in_part_see_only_their_own_rows(big_store) -> None:
    """Partial units live in one call's views, never in the shared ones another thread reads."""
    from concurrent.futures import ThreadPoolExecutor

    import lmdata

    path, enc = big_store
    r = lmdata.open(path, cache_bytes=0)
    rows = enc[: len(enc) // 512 * 512].reshape(-1, 512)

    def go(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(20):
            b = rng.integers(0, len(rows), 2)
            np.testing.assert_array_equal(r.packed_rows(b, 512), rows[b])

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(go, range(8)))


def test_chunks_stored_as_is_are_read_by_slices(tmp_path) -> None:
    """A Blosc frame stored as is (level 0, or data that would not compress) has nothing to
    decompress: rows are slices of its map, never a full copy (it was always decoded whole:
    one 'block' made every read count as the whole chunk)."""
    import lmdata
    from lmdata.formats.flat_tokens import Writer

    chunk, n = 1 << 16, 3 << 16
    toks = np.random.default_rng(0).integers(1, 50257, n, dtype=np.uint32)
    p = tmp_path / "d.zarr"
    with Writer(p, chunk_tokens=chunk, compression="blosc", manifest=False) as w:
        w.write(toks)
    for k in range(3):
        raw = numcodecs.Blosc("lz4", 0, 2).encode(toks[k * chunk : (k + 1) * chunk])
        assert raw[2] & 0x2  # stored as is
        (p / "train" / "encoded_tokens" / str(k)).write_bytes(bytes(raw))
    r = lmdata.open(p, cache_bytes=0)
    full = _spy(r)
    rows = np.random.default_rng(1).integers(0, n // 512, (20, 2))
    for b in rows:
        np.testing.assert_array_equal(r.packed_rows(b, 512), toks.reshape(-1, 512)[b])
    assert full == []


def test_close_lets_go_of_the_partial_reads_chunk_maps(big_store) -> None:
    import lmdata

    path, enc = big_store
    r = lmdata.open(path, cache_bytes=0)
    full = _spy(r)
    row = lambda: r.packed_rows(np.array([1]), 512)[0]  # noqa: E731
    np.testing.assert_array_equal(row(), enc[512:1024])
    part = r.tokens._partial
    assert full == [] and part._frames and part._spent  # read in part: its map is held
    r.close()
    assert r.tokens._partial is part and not part._frames and not part._spent
    np.testing.assert_array_equal(row(), enc[512:1024])  # read in part again after close
    assert full == [] and part._frames
