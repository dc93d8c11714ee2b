"""flat-tokens: the spec's example, seqax's own files, round trips, zarr-python interop."""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import (
    CorruptDataError,
    FormatError,
    InvalidInputError,
    OutputExistsError,
    UnsafeDataError,
)
from lmdata.formats.flat_tokens import Writer

DATA = Path(__file__).parent.parent / "data" / "flat_tokens"
SPEC = DATA / "spec_example.zarr"
EXPECTED = json.loads((DATA / "spec_example.expected.json").read_text())
ZARR2_PY = Path(__file__).parents[2] / ".venv" / "extra-zarr2" / "bin" / "python"

SPEC_SEQS = [[1, 2], [3, 4, 5], [6, 7, 8]]


def write(path: Path, train, validation=(), **kw) -> Path:
    # no manifest: these tests damage the files to exercise the reader's own checks (the
    # manifest's, which would name the damaged file first, are in test_manifest.py)
    kw.setdefault("manifest", False)
    with Writer(path, **kw) as w:
        for s in train:
            w.write(s)
        for s in validation:
            w.write(s, split="validation")
    return path


# ---- the reference files --------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "validation"])
def test_seqax_reference_store(split):
    r = lmdata.open(SPEC, split=split)
    exp = EXPECTED[split]
    assert [x.tolist() for x in r] == exp["sequences"]
    assert r.max_token_id == exp["max_token_id"]
    assert len(r) == len(exp["sequences"])
    assert r.num_tokens == sum(map(len, exp["sequences"]))
    assert lmdata.detect(SPEC) == "flat-tokens"
    assert lmdata.validate(SPEC) == []


def test_spec_worked_example_exactly(tmp_path):
    p = write(tmp_path / "ex.zarr", SPEC_SEQS, compression="blosc")
    r = lmdata.open(p)
    assert r.span_encoded(0, 8).tolist() == [3, 4, 7, 8, 10, 13, 14, 16]
    assert r.boundaries.tolist() == [0, 2, 5, 8]
    assert r.max_token_id == 8
    # unpacked sequence 1, and packed row 1 of length 4
    assert r.encoded(1).tolist() == [7, 8, 10]
    assert r[1].tolist() == [3, 4, 5]
    assert r.packed_rows([1], 4).tolist() == [[10, 13, 14, 16]]
    # the inputs/targets expansion of the spec
    b = lmdata.Loader(r, seq_len=8, global_batch_size=1, shuffle=False).batch(0)
    assert b["inputs"].tolist() == [[0, 1, 0, 3, 4, 0, 6, 7]]
    assert b["targets"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]


def test_writer_reproduces_seqax_bytes(tmp_path):
    """Metadata and decoded chunks equal what seqax's writer produced for the same data."""
    p = write(
        tmp_path / "ex.zarr",
        SPEC_SEQS,
        [[5], [9, 9, 9, 9]],
        compression="blosc",
        seq_starts_chunk=65536,
    )
    for rel in [
        "train/.zattrs",
        "validation/.zattrs",
        ".zgroup",
        "train/.zgroup",
        "train/encoded_tokens/.zarray",
        "train/seq_starts/.zarray",
    ]:
        assert (p / rel).read_bytes() == (SPEC / rel).read_bytes(), rel
    import numcodecs

    blosc = numcodecs.Blosc("lz4", 5, 2)
    for rel in ["train/encoded_tokens/0", "validation/encoded_tokens/0"]:
        assert blosc.decode((p / rel).read_bytes()) == blosc.decode((SPEC / rel).read_bytes())


def test_tokens_alias_of_encoded_tokens(tmp_path):
    p = tmp_path / "alias.zarr"
    shutil.copytree(SPEC, p)
    (p / "train" / "encoded_tokens").rename(p / "train" / "tokens")
    r = lmdata.open(p)
    assert [x.tolist() for x in r] == SPEC_SEQS


# ---- round trips ----------------------------------------------------------------------------

seqs_strategy = st.lists(
    st.lists(st.integers(0, 2**31 - 1), max_size=40).map(lambda x: np.array(x, dtype=np.int64)),
    max_size=30,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seqs=seqs_strategy,
    chunk=st.integers(1, 64),
    compression=st.sampled_from([None, "blosc", "zstd", "gzip"]),
)
def test_round_trip(tmp_path_factory, seqs, chunk, compression):
    p = tmp_path_factory.mktemp("rt") / "d.zarr"
    write(
        p,
        seqs,
        seqs[:3],
        chunk_tokens=chunk,
        seq_starts_chunk=max(1, chunk // 2),
        compression=compression,
    )
    r = lmdata.open(p)
    assert len(r) == len(seqs)
    assert [x.tolist() for x in r] == [s.tolist() for s in seqs]
    assert [x.tolist() for x in r.take(list(range(len(seqs)))[::-1])] == [
        s.tolist() for s in seqs[::-1]
    ]
    lo = len(seqs) // 3  # consecutive sequences: one read of their range, split
    assert [x.tolist() for x in r.take(list(range(lo, len(seqs))))] == [
        s.tolist() for s in seqs[lo:]
    ]
    flat = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
    assert r.num_tokens == len(flat)
    assert r.max_token_id == (int(flat.max()) if len(flat) else 0)
    if len(flat):
        a, b = len(flat) // 3, len(flat) - len(flat) // 4
        assert r.span(a, b).tolist() == flat[a:b].tolist()
    v = lmdata.open(p, split="validation")
    assert [x.tolist() for x in v] == [s.tolist() for s in seqs[:3]]
    assert lmdata.validate(p) == []


def test_negative_and_out_of_range_indices(tmp_path):
    r = lmdata.open(write(tmp_path / "d.zarr", SPEC_SEQS))
    assert r[-1].tolist() == [6, 7, 8]
    with pytest.raises(IndexError):
        r[3]
    with pytest.raises(IndexError):
        r.take([0, -4])


def test_empty_sequences_and_empty_dataset(tmp_path):
    seqs = [[], [1], [], [], [2, 3], []]
    r = lmdata.open(write(tmp_path / "d.zarr", seqs, chunk_tokens=2))
    assert [x.tolist() for x in r] == seqs
    assert lmdata.validate(tmp_path / "d.zarr") == []
    e = lmdata.open(write(tmp_path / "e.zarr", []))
    assert len(e) == 0 and e.num_tokens == 0
    assert lmdata.validate(tmp_path / "e.zarr") == []


@pytest.mark.parametrize("bad", [[2**31], [-1], [1.5], [[1, 2]]])
def test_writer_rejects_unstorable_ids(tmp_path, bad):
    with pytest.raises(InvalidInputError), Writer(tmp_path / "d.zarr") as w:
        w.write(bad)
    assert not (tmp_path / "d.zarr").exists()
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


def test_writer_is_atomic_and_refuses_to_overwrite(tmp_path):
    p = tmp_path / "d.zarr"
    w = Writer(p)
    w.write([1, 2, 3])
    assert not p.exists()  # nothing visible until close
    w.close()
    assert lmdata.open(p)[0].tolist() == [1, 2, 3]
    with pytest.raises(OutputExistsError):
        Writer(p)
    write(p, [[7]], overwrite=True)
    assert lmdata.open(p)[0].tolist() == [7]


def test_uncompressed_chunks_are_padded_sparsely(tmp_path):
    p = write(tmp_path / "d.zarr", [[1, 2, 3]], chunk_tokens=1 << 20)
    f = p / "train" / "encoded_tokens" / "0"
    assert f.stat().st_size == 4 << 20  # full chunk, as zarr v2 requires
    info = lmdata.info(p)
    assert info["splits"]["train"]["tokens"] == 3


# ---- interop with zarr-python ----------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "blosc", "zstd", "gzip"])
def test_zarr3_reads_lmdata_output(tmp_path, compression):
    zarr = pytest.importorskip("zarr")
    seqs = [[5, 6, 7], [], [8], list(range(100))]
    p = write(
        tmp_path / "d.zarr",
        seqs,
        chunk_tokens=16,
        seq_starts_chunk=4,
        compression=compression,
        manifest=True,
    )
    assert (p / "lmdata-manifest").is_file()
    g = zarr.open_group(str(p), mode="r")
    # listing the root group sees the manifest, says it is no zarr node, and goes on
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert sorted(name for name, _ in g.members()) == ["train", "validation"]
    assert all("lmdata-manifest" in str(w.message) for w in seen)
    enc = g["train"]["encoded_tokens"][:]
    starts = g["train"]["seq_starts"][:]
    assert starts.tolist() == [0, 3, 3, 4, 104]
    assert (enc >> 1).tolist() == [t for s in seqs for t in s]
    assert np.nonzero(enc & 1)[0].tolist() == [0, 3, 4]
    assert g["train"].attrs["max_token_id"] == 99


SEQAX_STYLE_READ = """
import sys, json, zarr, numpy as np
g = zarr.open_group(sys.argv[1], mode="r")
out = {}
for split in ("train", "validation"):
    s = g[split]
    enc = s["encoded_tokens"]; st = s["seq_starts"]
    assert enc.dtype == np.uint32 and st.dtype == np.uint64 and enc.ndim == 1
    e = enc[:]; b = st[:]
    out[split] = {"seqs": [(e[b[i]:b[i+1]] >> 1).tolist() for i in range(len(b) - 1)],
                  "max": int(s.attrs["max_token_id"])}
out["groups"] = sorted(g.group_keys())
print(json.dumps(out))
"""


@pytest.mark.skipif(not ZARR2_PY.exists(), reason="make install creates the zarr-python 2 venv")
@pytest.mark.parametrize("compression", [None, "blosc"])
def test_zarr2_reads_lmdata_output_like_seqax(tmp_path, compression):
    seqs = [[5, 6, 7], [], [8], list(range(50))]
    p = write(
        tmp_path / "d.zarr",
        seqs,
        [[1]],
        chunk_tokens=16,
        seq_starts_chunk=4,
        compression=compression,
        manifest=True,  # which zarr-python 2 ignores
    )
    assert (p / "lmdata-manifest").is_file()
    out = subprocess.run(
        [str(ZARR2_PY), "-c", SEQAX_STYLE_READ, str(p)], check=True, capture_output=True, text=True
    ).stdout
    got = json.loads(out)
    assert got["groups"] == ["train", "validation"]
    assert got["train"]["seqs"] == seqs and got["train"]["max"] == 49
    assert got["validation"]["seqs"] == [[1]]


ZARR2_WRITE = """
import sys, zarr, numcodecs, numpy as np
enc = np.array([3, 4, 7, 8, 10, 13, 14, 16] * 5, dtype=np.uint32)
starts = np.array([0] + [8 * k + o for k in range(5) for o in (2, 5, 8)], dtype=np.uint64)
comp = {"none": None, "blosc": numcodecs.Blosc("lz4", 5, 2), "zstd": numcodecs.Zstd(3),
        "gzip": numcodecs.GZip(5), "lz4": numcodecs.LZ4()}[sys.argv[2]]
g = zarr.open_group(sys.argv[1], mode="w")
for split in ("train", "validation"):
    s = g.require_group(split)
    a = s.empty("encoded_tokens", shape=(0,), chunks=(7,), dtype="<u4", compressor=comp)
    a.append(enc)
    b = s.zeros("seq_starts", shape=(1,), chunks=(2,), dtype="<u8", compressor=comp,
                filters=[numcodecs.Delta("i8")] if comp else None)
    b.append(starts[1:])
    s.attrs["max_token_id"] = 8
"""


@pytest.mark.skipif(not ZARR2_PY.exists(), reason="make install creates the zarr-python 2 venv")
@pytest.mark.parametrize("compression", ["none", "blosc", "zstd", "gzip", "lz4"])
def test_reads_stores_written_by_zarr2(tmp_path, compression):
    p = tmp_path / "z2.zarr"
    subprocess.run([str(ZARR2_PY), "-c", ZARR2_WRITE, str(p), compression], check=True)
    r = lmdata.open(p)
    assert [x.tolist() for x in r] == SPEC_SEQS * 5
    assert lmdata.validate(p) == []


@pytest.mark.parametrize(
    "zarr_format, shards",
    [(2, False), (3, False), (3, True)],  # sharding exists only in zarr format v3
)
@pytest.mark.parametrize("compressor", ["none", "zstd", "blosc", "gzip"])
def test_reads_stores_written_by_zarr3(tmp_path, zarr_format, compressor, shards):
    zarr = pytest.importorskip("zarr")
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    if zarr_format == 2:
        import numcodecs

        comp = {
            "none": None,
            "zstd": numcodecs.Zstd(3),
            "blosc": numcodecs.Blosc("lz4", 5, 2),
            "gzip": numcodecs.GZip(5),
        }[compressor]
    else:
        comp = {"none": None, "zstd": ZstdCodec(), "blosc": BloscCodec(), "gzip": GzipCodec()}[
            compressor
        ]
    seqs = [list(range(1, 1 + (i % 7))) for i in range(60)]
    enc = np.concatenate([np.array(s, np.uint32) * 2 + (np.arange(len(s)) == 0) for s in seqs])
    starts = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.uint64)
    g = zarr.open_group(str(tmp_path / "z3.zarr"), mode="w", zarr_format=zarr_format)
    for split in ("train", "validation"):
        s = g.create_group(split)
        kw = {"shards": (40,)} if shards else {}
        a = s.create_array(
            "encoded_tokens",
            shape=enc.shape,
            chunks=(10,),
            dtype="uint32",
            compressors=comp,
            fill_value=0,
            **kw,
        )
        a[:] = enc
        b = s.create_array(
            "seq_starts",
            shape=starts.shape,
            chunks=(8,),
            dtype="uint64",
            compressors=comp,
            fill_value=0,
            **({"shards": (16,)} if shards else {}),
        )
        b[:] = starts
        s.attrs["max_token_id"] = 6
    r = lmdata.open(tmp_path / "z3.zarr")
    assert [x.tolist() for x in r] == seqs
    assert r.span(5, 200).tolist() == (enc[5:200] >> 1).tolist()
    assert lmdata.validate(tmp_path / "z3.zarr") == []


def test_missing_chunk_reads_as_fill_value(tmp_path):
    p = write(tmp_path / "d.zarr", [[1] * 10, [2] * 10], chunk_tokens=4)
    (p / "train" / "encoded_tokens" / "2").unlink()  # tokens 8..11 -> fill value (0)
    r = lmdata.open(p)
    assert r.span_encoded(8, 12).tolist() == [0, 0, 0, 0]
    problems = lmdata.validate(p)
    assert any("1 of 5 chunks have no file" in x and "[2]" in x for x in problems), problems


def test_hostile_shapes_are_refused_or_reported_quickly(tmp_path):
    p = write(tmp_path / "d.zarr", [[1, 2], [3]], compression="blosc")
    tok_meta = p / "train" / "encoded_tokens" / ".zarray"
    meta = json.loads(tok_meta.read_text())
    meta["shape"] = [10**14]  # all but one chunk missing: validate must not read them all
    tok_meta.write_text(json.dumps(meta))
    problems = lmdata.validate(p)
    assert any("chunks have no file" in x for x in problems)
    meta["shape"] = [2**64]
    tok_meta.write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="implausibly large"):
        lmdata.open(p)
    meta["shape"] = [3]
    tok_meta.write_text(json.dumps(meta))
    ss_meta = p / "train" / "seq_starts" / ".zarray"
    meta = json.loads(ss_meta.read_text())
    meta["shape"] = [400_000_000]  # seq_starts chunks beyond the first do not exist
    ss_meta.write_text(json.dumps(meta))
    with pytest.raises(CorruptDataError, match="does not exist, so it reads as the fill value"):
        lmdata.open(p, split="train")
    assert any("chunk files exist" in x for x in lmdata.validate(p))


# ---- chunks never written read as the fill value (zarr semantics) --------------------------

SEQAX_EMPTY_SPLIT = """
import sys, zarr, numcodecs
comp = numcodecs.Blosc("lz4", 5, 2)
g = zarr.open_group(sys.argv[1], mode="w-")
for split in ("validation", "train"):  # seqax's order; validation gets nothing
    s = g.require_group(split)
    s.attrs["max_token_id"] = 0
    s.empty("encoded_tokens", shape=(0,), chunks=(1 << 22,), dtype="<u4", compressor=comp)
    s.zeros("seq_starts", shape=(1,), chunks=(1 << 16,), dtype="<u8", compressor=comp,
            filters=[numcodecs.Delta("i8")])
g["train"]["encoded_tokens"].append(__import__("numpy").array([3, 4, 7], dtype="<u4"))
g["train"]["seq_starts"].append(__import__("numpy").array([2, 3], dtype="<u8"))
g["train"].attrs["max_token_id"] = 3
"""


@pytest.mark.skipif(not ZARR2_PY.exists(), reason="make install creates the zarr-python 2 venv")
def test_empty_split_written_by_seqax_style_zarr2(tmp_path):
    p = tmp_path / "d.zarr"
    subprocess.run([str(ZARR2_PY), "-c", SEQAX_EMPTY_SPLIT, str(p)], check=True)
    assert not (p / "validation" / "seq_starts" / "0").exists()  # zarr never wrote it
    r = lmdata.open(p, split="validation")
    assert len(r) == 0 and r.num_tokens == 0 and list(r) == []
    assert [x.tolist() for x in lmdata.open(p)] == [[1, 2], [3]]
    assert lmdata.validate(p) == []


@pytest.mark.parametrize("compression", [None, "blosc"])
def test_unwritten_seq_starts_chunk_of_an_empty_split(tmp_path, compression):
    p = write(tmp_path / "d.zarr", [[1, 2]], [], compression=compression)
    chunk = p / "validation" / "seq_starts" / "0"
    chunk.unlink(missing_ok=True)  # what zarr does for a chunk equal to the fill value
    r = lmdata.open(p, split="validation")
    assert len(r) == 0 and list(r) == [] and r.boundaries.tolist() == [0]
    assert lmdata.validate(p) == []


def test_unwritten_seq_starts_chunk_with_data_is_refused(tmp_path):
    p = write(tmp_path / "d.zarr", [[1, 2], [3], [4, 5]], seq_starts_chunk=2)
    (p / "train" / "seq_starts" / "1").unlink()  # entries 2..3 now read as 0
    with pytest.raises(CorruptDataError, match="last entry of seq_starts is 0, must be 5"):
        lmdata.open(p)
    problems = lmdata.validate(p)
    assert any("chunks [1] have no file" in x for x in problems), problems
    assert any("must equal the token count 5" in x for x in problems), problems


@pytest.mark.parametrize(
    "key, value",
    [("compressor", {"id": []}), ("filters", [False]), ("chunks", "x"), ("dtype", 5)],
)
def test_malformed_metadata_is_a_format_error(tmp_path, key, value):
    p = write(tmp_path / "d.zarr", [[1, 2], [3]], compression="blosc")
    f = p / "train" / "seq_starts" / ".zarray"
    meta = json.loads(f.read_text())
    meta[key] = value
    f.write_text(json.dumps(meta))
    with pytest.raises(FormatError):
        lmdata.open(p)


def test_iteration_checks_seq_starts(tmp_path):
    p = write(tmp_path / "d.zarr", [[1, 2], [3, 4, 5], [6]])
    _set_raw(p, "seq_starts", np.array([0, 5, 2, 6]))  # ends right, decreases in the middle
    r = lmdata.open(p)
    with pytest.raises(CorruptDataError, match="non-decreasing"):
        list(r)
    f = p / "train" / "seq_starts" / ".zarray"
    meta = json.loads(f.read_text())
    meta["shape"] = [6]  # two more entries, past the end of the chunk: fill value 0
    f.write_text(json.dumps(meta))
    with pytest.raises(CorruptDataError, match="last entry of seq_starts is 0"):
        lmdata.open(p)


# ---- corrupt and hostile input ---------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "blosc", "zstd", "gzip"])
@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_chunk_is_corrupt_data_error(tmp_path, compression, damage):
    p = write(tmp_path / "d.zarr", [list(range(1, 100))], chunk_tokens=32, compression=compression)
    f = p / "train" / "encoded_tokens" / "1"
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 3])
    elif damage == "garbage":
        f.write_bytes(bytes(range(256)) * 3)
    else:
        f.write_bytes(b"")
    r = lmdata.open(p)
    if compression is None and damage == "garbage":
        # raw chunks carry no check: garbage of the right size reads as data, and validate
        # reports the start bits and ids it breaks
        r.span(32, 64)
        assert lmdata.validate(p)
        return
    with pytest.raises(CorruptDataError) as ei:
        r.span(0, 99)
    assert "encoded_tokens/1" in str(ei.value) and "chunk 1" in str(ei.value)
    assert any("encoded_tokens" in x for x in lmdata.validate(p))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(junk=st.binary(max_size=300))
def test_random_bytes_never_escape_as_raw_errors(tmp_path_factory, junk):
    p = tmp_path_factory.mktemp("j") / "d.zarr"
    write(p, [list(range(1, 40))], chunk_tokens=16, compression="zstd")
    (p / "train" / "encoded_tokens" / "0").write_bytes(junk)
    r = lmdata.open(p)
    try:
        r.span(0, 39)
    except CorruptDataError:
        pass


def test_hostile_metadata(tmp_path):
    p = write(tmp_path / "d.zarr", [[1, 2]], compression="zstd")
    meta_path = p / "train" / "encoded_tokens" / ".zarray"
    meta = json.loads(meta_path.read_text())
    meta["chunks"] = [2**40]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UnsafeDataError):
        lmdata.open(p)
    meta["chunks"] = [16]
    meta["compressor"] = {"id": "pickle"}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UnsafeDataError, match="pickle"):
        lmdata.open(p)
    meta_path.write_text("{not json")
    with pytest.raises(CorruptDataError):
        lmdata.open(p)


def test_decompression_bomb_is_refused(tmp_path):
    import zstandard

    p = write(tmp_path / "d.zarr", [list(range(1, 30))], chunk_tokens=16, compression="zstd")
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    (p / "train" / "encoded_tokens" / "0").write_bytes(bomb)
    with pytest.raises(CorruptDataError, match="declares"):
        lmdata.open(p).span(0, 16)
    # a frame that does not declare its size is bounded while decoding
    quiet = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (64 << 20))
    (p / "train" / "encoded_tokens" / "0").write_bytes(quiet)
    with pytest.raises(CorruptDataError, match="chunk 0"):
        lmdata.open(p).span(0, 16)


@pytest.mark.parametrize(
    "filters",
    [["CRC32"], ["Adler32"], ["Fletcher32"], ["AsType"], ["Delta", "CRC32"]],
)
@pytest.mark.parametrize("compressor", ["Zstd", "LZ4", "Blosc", "GZip"])
def test_v2_filters_that_grow_a_chunk_are_read(tmp_path, filters, compressor):
    # A checksum filter appends 4 bytes and AsType widens items before the compressor runs:
    # the frame declares more than the chunk's bytes, and valid stores were once refused
    # ("zstd frame declares 16388 bytes, more than the chunk's 16384").
    import numcodecs

    seqs = [list(range(1, 40)), list(range(5, 70))]
    p = write(tmp_path / "d.zarr", seqs, chunk_tokens=16)
    made = {
        "CRC32": numcodecs.CRC32(),
        "Adler32": numcodecs.Adler32(),
        "Fletcher32": numcodecs.Fletcher32(),
        "AsType": numcodecs.AsType(encode_dtype="<u8", decode_dtype="<u4"),
        "Delta": numcodecs.Delta(dtype="<u4"),
    }
    chain = [made[f] for f in filters]
    comp = getattr(numcodecs, compressor)()
    arr = p / "train" / "encoded_tokens"
    meta = json.loads((arr / ".zarray").read_text())
    nbytes = meta["chunks"][0] * 4
    for chunk in arr.iterdir():
        if chunk.name.startswith("."):
            continue
        raw = chunk.read_bytes().ljust(nbytes, b"\0")
        data = np.frombuffer(raw, "<u4")
        for f in chain:
            data = f.encode(data)
        chunk.write_bytes(comp.encode(data))
    meta["filters"] = [f.get_config() for f in chain]
    meta["compressor"] = comp.get_config()
    (arr / ".zarray").write_text(json.dumps(meta))
    assert [x.tolist() for x in lmdata.open(p)] == seqs


def test_open_errors_name_the_problem(tmp_path):
    with pytest.raises(lmdata.errors.DatasetNotFoundError):
        lmdata.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="cannot tell the format"):
        lmdata.open(tmp_path / "empty")
    p = write(tmp_path / "d.zarr", [[1]])
    with pytest.raises(FormatError, match="no split 'test'"):
        lmdata.open(p, split="test")


# ---- validate --------------------------------------------------------------------------------


def _set_raw(p: Path, name: str, values: np.ndarray) -> None:
    """Rewrite an uncompressed array's single chunk with ``values`` (and its shape)."""
    d = p / "train" / name
    meta = json.loads((d / ".zarray").read_text())
    meta["shape"] = [len(values)]
    meta["chunks"] = [max(len(values), 1)]
    (d / ".zarray").write_text(json.dumps(meta))
    for f in d.iterdir():
        if f.name != ".zarray":
            f.unlink()
    (d / "0").write_bytes(values.astype(meta["dtype"]).tobytes())


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("starts_first", "seq_starts[0]: is 1, must be 0"),
        ("starts_last", "must equal the token count"),
        ("starts_decrease", "less than the entry before"),
        ("extra_bit", "has a start bit but no sequence starts there"),
        ("missing_bit", "start bit is 0"),
        ("id_over_max", "greater than max_token_id"),
        ("no_max", "max_token_id is missing"),
        ("no_validation", "validation: missing"),
        ("dtype", "the spec says uint32"),
    ],
)
def test_validate_reports_each_failure(tmp_path, damage, expected):
    p = write(tmp_path / "d.zarr", [[1, 2], [3, 4, 5], [6, 7, 8]], [[1]])
    enc = np.array([3, 4, 7, 8, 10, 13, 14, 16], dtype=np.uint32)
    if damage == "starts_first":
        _set_raw(p, "seq_starts", np.array([1, 2, 5, 8]))
    elif damage == "starts_last":
        _set_raw(p, "seq_starts", np.array([0, 2, 5, 7]))
    elif damage == "starts_decrease":
        _set_raw(p, "seq_starts", np.array([0, 5, 2, 8]))
    elif damage == "extra_bit":
        enc[1] |= 1
        _set_raw(p, "encoded_tokens", enc)
    elif damage == "missing_bit":
        enc[2] &= ~np.uint32(1)
        _set_raw(p, "encoded_tokens", enc)
    elif damage == "id_over_max":
        enc[3] = 40
        _set_raw(p, "encoded_tokens", enc)
    elif damage == "no_max":
        (p / "train" / ".zattrs").write_text("{}")
    elif damage == "no_validation":
        shutil.rmtree(p / "validation")
    elif damage == "dtype":
        d = p / "train" / "encoded_tokens"
        meta = json.loads((d / ".zarray").read_text())
        meta["dtype"] = "<u8"
        (d / ".zarray").write_text(json.dumps(meta))
        (d / "0").write_bytes(enc.astype("<u8").tobytes() + bytes(8 * ((1 << 22) - 8)))
    problems = lmdata.validate(p)
    assert any(expected in x for x in problems), problems
    assert all(x.startswith(("train", "validation")) for x in problems), problems


def test_a_missing_seq_starts_chunk_between_others_is_refused_on_open(tmp_path):
    """Its entries would read as the fill value 0: sequences silently empty (validate says so
    too, but opening must not serve them)."""
    seqs = [[i + 1] * 3 for i in range(12)]
    p = write(tmp_path / "d.zarr", seqs, chunk_tokens=16, seq_starts_chunk=4)
    (p / "train" / "seq_starts" / "1").unlink()
    with pytest.raises(CorruptDataError, match=r"chunk\(s\) \[1\] have no file"):
        lmdata.open(p)
    assert any("seq_starts" in x for x in lmdata.validate(p))
