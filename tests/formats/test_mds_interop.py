"""Both directions against mosaicml-streaming 0.13.0, run in its own venv (.venv/extra-streaming).

lmdata writes -> StreamingDataset reads (random access and iteration), for every encoding and
every compression; streaming writes -> lmdata reads; uncompressed shards, .meta files and
index.json are byte-identical for the same samples. Starting streaming costs seconds, so the
module prepares every dataset first and runs streaming twice: once to write, once to read.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

import lmdata
from lmdata import formats
from tests.formats.mds_samples import canonical, columns, run_streaming, samples, streaming_python

pytestmark = pytest.mark.skipif(
    streaming_python() is None,
    reason="mosaicml-streaming venv .venv/extra-streaming is absent (make install creates it)",
)

LM_FORMAT = {
    "mds": "mds",
    "csv": "mds-csv",
    "tsv": "mds-tsv",
    "json": "mds-jsonl",
    "xsv": "mds-csv",
}

# (recipe, n, streaming format, writer options): both tools write these, uncompressed
SAME_BYTES = [
    ("all", 40, "mds", {"size_limit": 3000, "hashes": ["sha1", "xxh64"]}),
    ("all", 3, "mds", {"size_limit": 600}),  # first sample too big: an empty first shard
    ("images", 4, "mds", {"size_limit": 5000}),
    ("tokens", 60, "mds", {"size_limit": "1kb", "hashes": ["blake2b", "md5", "xxh3_128"]}),
    ("mdstext", 50, "mds", {"size_limit": None}),
    ("text", 30, "csv", {"size_limit": 100}),
    ("text", 30, "tsv", {}),
    ("xsv", 10, "xsv", {"size_limit": 64}),
    ("text", 30, "json", {"size_limit": 200, "hashes": ["sha256"]}),
]
COMPRESSIONS = [None, "zstd", "zstd:1", "gz", "gz:1", "bz2", "br:5", "snappy"]
# lmdata writes, streaming reads: other encodings and formats, compressed or not
OTHERS = [
    ("images", "mds", "zstd"),
    ("pkl", "mds", None),
    ("text", "csv", "bz2"),
    ("text", "tsv", None),
    ("text", "json", "br"),
    ("xsv", "xsv", "snappy"),
]
# streaming writes compressed, lmdata reads
THEIRS_COMPRESSED = ["bz2", "br", "zstd:16", "gz:0", "snappy"]
PICKS = [24, 0, 13, 6, 6, 2, 3]


def write_lmdata(out: Path, recipe: str, n: int, fmt: str = "mds", **kw: Any) -> None:
    if fmt == "xsv":
        kw.setdefault("separator", "|")
    with lmdata.writer(out, LM_FORMAT[fmt], columns=columns(recipe), **kw) as w:
        for s in samples(recipe, n):
            w.write(s)


def files(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mds-interop")
    writes: list[dict[str, Any]] = []
    for k, (recipe, n, fmt, kw) in enumerate(SAME_BYTES):
        write_lmdata(root / f"same{k}-ours", recipe, n, fmt, **kw)
        writes.append(
            {
                "op": "write",
                "out": str(root / f"same{k}-theirs"),
                "recipe": recipe,
                "n": n,
                "format": fmt,
                **kw,
            }
        )
    for c in THEIRS_COMPRESSED:
        writes.append(
            {
                "op": "write",
                "out": str(root / f"theirs-{c}"),
                "recipe": "all",
                "n": 15,
                "compression": c,
                "size_limit": 2000,
                "hashes": ["md5", "sha1"],
            }
        )
    for part in ("theirs-merge", "ours-merge"):
        for k in range(2):
            out = root / part / str(k)
            comp = "zstd" if k else None
            if part.startswith("theirs"):
                writes.append(
                    {
                        "op": "write",
                        "out": str(out),
                        "recipe": "mdstext",
                        "n": 3 + k,
                        "compression": comp,
                    }
                )
            else:
                write_lmdata(out, "mdstext", 3 + k, compression=comp)
    writes.append({"op": "merge", "root": str(root / "theirs-merge")})

    # what lmdata writes for streaming to read
    ours: dict[str, Path] = {}
    for c in COMPRESSIONS:
        ours[f"all-{c}"] = root / f"ours-all-{c}"
        write_lmdata(ours[f"all-{c}"], "all", 25, compression=c, size_limit=2500, hashes=["sha1"])
    for recipe, fmt, c in OTHERS:
        ours[f"{recipe}-{fmt}-{c}"] = root / f"ours-{recipe}-{fmt}-{c}"
        write_lmdata(ours[f"{recipe}-{fmt}-{c}"], recipe, 7, fmt, compression=c, size_limit=3000)
    jsonl = root / "ours-jsonl-merged"
    for k in range(3):
        write_lmdata(jsonl / str(k), "text", 4 + k, "json", size_limit=90)
    formats.spec("mds-jsonl").merge([str(jsonl)], str(jsonl))
    ours["jsonl-merged"] = jsonl

    # one streaming process (importing it and torch takes seconds): its writes, then its reads
    # of copies of everything (lmdata reads the originals)
    reads, results = [], {}
    sizes = {key: len(lmdata.open(src)) for key, src in ours.items()}
    for c in THEIRS_COMPRESSED:
        ours[f"theirs-{c}"] = root / f"theirs-{c}"
        sizes[f"theirs-{c}"] = 15  # (the write job's n)
    for key, src in ours.items():
        local = root / "streaming-copies" / key  # streaming writes beside compressed shards
        if key.startswith("theirs-"):
            reads.append({"op": "copy", "src": str(src), "dst": str(local)})
        else:
            shutil.copytree(src, local)
        results[key] = root / "results" / f"{key}.pkl"
        results[key].parent.mkdir(exist_ok=True)
        reads.append(
            {
                "op": "read",
                "local": str(local),
                "result": str(results[key]),
                "indices": [i for i in PICKS if i < sizes[key]],
                "unsafe": key.startswith("pkl"),
            }
        )
    names = {"op": "names", "local": str(root / "streaming-copies" / "all-None")}
    *_, shm = run_streaming({"op": "batch", "jobs": [*writes, *reads, names]})["results"]
    for c in THEIRS_COMPRESSED:  # what streaming wrote holds the samples its write job says
        assert len(lmdata.open(ours[f"theirs-{c}"])) == sizes[f"theirs-{c}"]
    got = {}
    for key, path in results.items():
        with open(path, "rb") as f:
            got[key] = pickle.load(f)  # written by our helper in this test run
    return {"root": root, "ours": ours, "got": got, "names": shm}


@pytest.mark.parametrize("k", range(len(SAME_BYTES)))
def test_uncompressed_output_is_byte_identical(world: dict[str, Any], k: int) -> None:
    root = world["root"]
    theirs, ours = files(root / f"same{k}-theirs"), files(root / f"same{k}-ours")
    assert ours.pop("lmdata-manifest")  # lmdata's manifest, beside streaming's exact files
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name] == theirs[name], name
    if k == 1:
        assert b'"samples": 0' in theirs["index.json"]  # the empty-shard quirk was exercised


def _check_read(world: dict[str, Any], key: str) -> None:
    trust = {"allow_unsafe_pickle": True} if key.startswith("pkl") else {}
    want = [canonical(s) for s in lmdata.open(world["ours"][key], **trust)]
    got = world["got"][key]
    assert got["size"] == len(want)
    assert got["iterated"] == want
    assert got["random"] == [want[i] for i in PICKS if i < len(want)]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_streaming_reads_what_lmdata_writes(world: dict[str, Any], compression) -> None:
    assert (world["ours"][f"all-{compression}"] / "lmdata-manifest").is_file()  # ignored by it
    _check_read(world, f"all-{compression}")
    if compression:
        names = {p.name for p in world["ours"][f"all-{compression}"].iterdir()}
        assert not any(n.endswith(".mds") for n in names)  # only compressed shards are written


@pytest.mark.parametrize(("recipe", "fmt", "compression"), OTHERS)
def test_streaming_reads_other_encodings_and_formats(
    world: dict[str, Any], recipe, fmt, compression
) -> None:
    _check_read(world, f"{recipe}-{fmt}-{compression}")


def test_streaming_reads_lmdata_merged_jsonl_partitions(world: dict[str, Any]) -> None:
    _check_read(world, "jsonl-merged")
    assert len(world["got"]["jsonl-merged"]["iterated"]) == 15


@pytest.mark.parametrize("compression", THEIRS_COMPRESSED)
def test_lmdata_reads_what_streaming_writes_compressed(world: dict[str, Any], compression) -> None:
    _check_read(world, f"theirs-{compression}")
    assert lmdata.validate(world["ours"][f"theirs-{compression}"]) == []


def test_merge_matches_streaming_merge_index(world: dict[str, Any]) -> None:
    root = world["root"]
    formats.spec("mds").merge([str(root / "ours-merge")], str(root / "ours-merge"))
    t = json.loads((root / "theirs-merge" / "index.json").read_text())
    o = json.loads((root / "ours-merge" / "index.json").read_text())
    for idx in (t, o):  # zstd libraries may pick different bytes: compare all but zip sizes
        for s in idx["shards"]:
            if s["zip_data"]:
                s["zip_data"]["bytes"] = None
    assert o == t
    assert list(o) == ["version", "shards"]  # streaming's merged key order
    assert [canonical(x) for x in lmdata.open(root / "ours-merge")] == [
        canonical(x) for x in lmdata.open(root / "theirs-merge")
    ]


def test_streaming_helper_uses_shared_memory_names_of_its_own(world: dict[str, Any]) -> None:
    """Two test runs (or a test and a benchmark) using streaming at once cannot take or
    unlink each other's shared memory: the helper's names carry its own tag, and it leaves
    none behind."""
    import os

    got = world["names"]
    assert got["tag"].startswith("lmd") and len(got["shm"]) >= 4
    assert all(n.startswith(f"{got['tag']}_") for n in got["shm"])
    assert any(n.endswith("_locals") for n in got["shm"])
    if os.path.isdir("/dev/shm"):
        assert not [n for n in os.listdir("/dev/shm") if got["tag"] in n]


def test_streaming_venv_works_as_it_is(tmp_path):
    """`make install` leaves a venv where streaming imports without the test helper."""
    import subprocess

    code = (
        "import sys; from streaming import MDSWriter, StreamingDataset\n"
        "with MDSWriter(out=sys.argv[1], columns={'a': 'int'}) as w: w.write({'a': 5})\n"
        "print(StreamingDataset(local=sys.argv[1], batch_size=1)[0]['a'])\n"
    )
    out = subprocess.run(
        [streaming_python(), "-c", code, str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=True,
        env={"TQDM_DISABLE": "1"},
    )
    assert out.stdout.strip() == "5"
    assert lmdata.open(tmp_path / "o")[0] == {"a": 5}
