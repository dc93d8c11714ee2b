"""lmdata.compat.streaming against mosaicml-streaming 0.13.0 (run in .venv/extra-streaming).

The writers must produce the files streaming's writers produce, byte for byte (zstd frames
included; gzip differs only in the header's mtime); the dataset must return the values
streaming returns and resume from streaming's state dict (the shuffled order: test_streaming_order).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmdata.compat.streaming import (
    CSVWriter,
    JSONWriter,
    MDSWriter,
    Stream,
    StreamingDataset,
    TSVWriter,
    XSVWriter,
)
from lmdata.errors import InvalidInputError, OutputExistsError
from tests.formats.mds_samples import canonical, columns, run_streaming, samples, streaming_python

needs_streaming = pytest.mark.skipif(
    streaming_python() is None,
    reason="mosaicml-streaming venv .venv/extra-streaming is absent (make install creates it)",
)

WRITERS = {
    "mds": MDSWriter,
    "csv": CSVWriter,
    "tsv": TSVWriter,
    "json": JSONWriter,
    "xsv": XSVWriter,
}
# (recipe, n, streaming format, options): written by both tools, compared file by file
CASES = [
    ("all", 30, "mds", {"compression": "zstd", "size_limit": 2500, "hashes": ["sha1"]}),
    ("all", 20, "mds", {"compression": "zstd:16", "size_limit": 4000}),
    ("tokens", 40, "mds", {"compression": "zstd:1", "size_limit": "1kb"}),
    ("all", 12, "mds", {"compression": "bz2", "size_limit": 3000}),
    ("all", 12, "mds", {"compression": "br:5", "size_limit": 3000}),
    ("all", 12, "mds", {"compression": "snappy", "size_limit": 3000}),
    ("all", 12, "mds", {"compression": "gz:1", "size_limit": 3000}),
    ("images", 4, "mds", {"size_limit": 5000}),
    ("text", 30, "csv", {"compression": "zstd", "size_limit": 100}),
    ("text", 30, "tsv", {}),
    ("xsv", 10, "xsv", {"size_limit": 64, "separator": "|"}),
    ("text", 30, "json", {"size_limit": 200, "hashes": ["sha256"], "compression": "zstd:7"}),
]


def files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))}


def write_ours(out: Path, recipe: str, n: int, fmt: str, **kw: Any) -> None:
    with WRITERS[fmt](out=str(out), columns=columns(recipe), **kw) as w:
        for s in samples(recipe, n):
            w.write({**s, "not_a_column": 1})  # streaming ignores keys that are not columns


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if streaming_python() is None:
        pytest.skip("no .venv/extra-streaming")
    root = tmp_path_factory.mktemp("compat-streaming")
    jobs: list[dict[str, Any]] = []
    for k, (recipe, n, fmt, kw) in enumerate(CASES):
        write_ours(root / f"ours{k}", recipe, n, fmt, **kw)
        jobs.append(
            {"op": "write", "out": str(root / f"theirs{k}"), "recipe": recipe, "n": n}
            | {"format": fmt, **kw}
        )
    write_ours(root / "read", "mdstext", 37, "mds", size_limit=300, compression="zstd")
    jobs.append(
        {"op": "read", "local": str(root / "read"), "result": str(root / "read.pkl")}
        | {"indices": [0, 36, 5, 5, 20], "batch_size": 4}
    )
    run_streaming({"op": "batch", "jobs": jobs})
    with open(root / "read.pkl", "rb") as f:
        read = pickle.load(f)
    return {"root": root, "read": read}


def _gunzip_payloads(d: dict[str, bytes]) -> dict[str, bytes]:
    return {k: gzip.decompress(v) if k.endswith(".gz") else v for k, v in d.items()}


@needs_streaming
@pytest.mark.parametrize("k", range(len(CASES)))
def test_writers_write_what_streaming_writes(world: dict[str, Any], k: int) -> None:
    ours = files(world["root"] / f"ours{k}")
    theirs = files(world["root"] / f"theirs{k}")
    assert sorted(ours) == sorted(theirs)
    if CASES[k][3].get("compression", "").startswith("gz"):
        # gzip headers carry the time of writing (streaming: now; lmdata: 0): the payloads and
        # the index apart from the compressed sizes and hashes must agree
        assert _gunzip_payloads(ours) == _gunzip_payloads(theirs)
        for name in ours:
            if name.endswith(".gz"):
                assert ours[name][10:] == theirs[name][10:], name  # all but the header
        return
    for name in ours:
        assert ours[name] == theirs[name], name


@needs_streaming
def test_dataset_returns_what_streaming_returns(world: dict[str, Any]) -> None:
    ds = StreamingDataset(local=str(world["root"] / "read"), batch_size=4)
    got = world["read"]
    assert ds.size == got["size"] == len(ds) == 37
    assert [canonical(ds[i]) for i in [0, 36, 5, 5, 20]] == got["random"]
    assert [canonical(s) for s in ds] == got["iterated"]
    assert canonical(ds[-1]) == canonical(ds[36])
    assert [canonical(s) for s in ds[2:5]] == got["iterated"][2:5]


@needs_streaming
def test_resume_from_streaming_state(tmp_path: Path) -> None:
    write_ours(tmp_path / "d", "mdstext", 23, "mds", size_limit=200)
    helper = Path(__file__).with_name("streaming_compat_helper.py")
    job = {"op": "resume", "local": str(tmp_path / "d"), "batch_size": 2, "k": 7}
    out = subprocess.run(
        [streaming_python(), str(helper), json.dumps(job)],  # type: ignore[list-item]
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])

    ds = StreamingDataset(local=str(tmp_path / "d"), batch_size=2)
    it = iter(ds)
    first = [next(it)["id"] for _ in range(7)]
    state = ds.state_dict(7, False)
    assert first == theirs["first"]
    assert state == theirs["state"]
    fresh = StreamingDataset(local=str(tmp_path / "d"), batch_size=2)
    fresh.load_state_dict(theirs["state"])
    assert [s["id"] for s in fresh] == theirs["rest"] == list(range(7, 23))
    assert [s["id"] for s in fresh] == list(range(23))  # the next epoch starts over


def test_readme_example_runs_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """streaming's README example with only the import changed."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    np.random.seed(0)  # noqa: NPY002 (the example uses the legacy API)
    # --- from streaming's README ---
    data_dir = "path-to-dataset"
    columns = {"image": "jpeg", "class": "int"}
    compression = "zstd"
    with MDSWriter(out=data_dir, columns=columns, compression=compression) as out:
        for _ in range(100):
            sample = {
                "image": Image.fromarray(np.random.randint(0, 255, (32, 32, 3), np.uint8)),  # noqa: NPY002
                "class": np.random.randint(10),  # noqa: NPY002
            }
            out.write(sample)
    # local holds the dataset, so the remote is never contacted (as in streaming)
    remote = "s3://my-bucket/path-to-dataset"
    local = data_dir
    dataset = StreamingDataset(local=local, remote=remote, shuffle=True)
    sample = dataset[42]
    # --- end of the example ---
    assert sample["image"].size == (32, 32) and 0 <= sample["class"] < 10
    seen = [s["class"] for s in dataset]
    assert sorted(seen) == sorted(dataset[i]["class"] for i in range(100))
    assert seen != [dataset[i]["class"] for i in range(100)]  # shuffled


def test_shuffle_is_a_permutation_per_epoch(tmp_path: Path) -> None:
    write_ours(tmp_path / "d", "mdstext", 50, "mds")
    ds = StreamingDataset(local=str(tmp_path / "d"), shuffle=True, shuffle_seed=3, batch_size=5)
    e0 = [s["id"] for s in ds]
    e1 = [s["id"] for s in ds]
    assert sorted(e0) == sorted(e1) == list(range(50))
    assert e0 != e1 and e0 != list(range(50))
    again = StreamingDataset(local=str(tmp_path / "d"), shuffle=True, shuffle_seed=3, batch_size=5)
    assert [s["id"] for s in again] == e0


def test_ranks_split_the_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_ours(tmp_path / "d", "mdstext", 23, "mds")
    seen = []
    for rank in range(3):
        monkeypatch.setenv("WORLD_SIZE", "3")
        monkeypatch.setenv("RANK", str(rank))
        ds = StreamingDataset(local=str(tmp_path / "d"), batch_size=2)
        ids = [s["id"] for s in ds]
        assert len(ids) == len(ds) == 8
        if rank == 1:  # 3 nodes, 3 canonical nodes: rank 1 reads the second third
            assert ids[:4] == [7, 8, 9, 10]
        seen += ids
    assert set(seen) == set(range(23))  # every sample, one padded repeat


def test_writer_errors_and_atomicity(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(OutputExistsError):
        MDSWriter(out=str(tmp_path / "full"), columns={"a": "int"})
    with pytest.raises(InvalidInputError, match="Invalid Writer argument"):
        MDSWriter(out=str(tmp_path / "o"), columns={"a": "int"}, bogus=1)
    with pytest.raises(InvalidInputError, match="local directories only"):
        MDSWriter(out=(str(tmp_path / "o"), "s3://b/x"), columns={"a": "int"})
    with pytest.raises(KeyError), MDSWriter(out=str(tmp_path / "o"), columns={"a": "int"}) as w:
        w.write({"a": 1})
        w.write({"b": 2})
    assert not (tmp_path / "o").exists()  # an exception leaves nothing behind
    with MDSWriter(out=str(tmp_path / "full"), columns={"a": "int"}, exist_ok=True) as w:
        w.write({"a": 1})
    assert sorted(os.listdir(tmp_path / "full")) == ["index.json", "shard.00000.mds"]


def test_dataset_refuses_remote_and_bad_knobs(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="local datasets only"):
        StreamingDataset(remote="s3://bucket/x", local=str(tmp_path / "cache"))
    with pytest.raises(InvalidInputError, match="local datasets only"):
        StreamingDataset(streams=[Stream(remote="s3://bucket/x")])
    write_ours(tmp_path / "d", "mdstext", 5, "mds")
    d = str(tmp_path / "d")
    with pytest.raises(InvalidInputError, match="not both"):
        StreamingDataset(streams=[Stream(local=d)], local=d)
    with pytest.raises(InvalidInputError, match="At most one"):
        Stream(local=d, proportion=1, repeat=2)
    with pytest.raises(InvalidInputError, match="do not mix"):
        StreamingDataset(streams=[Stream(local=d, proportion=1), Stream(local=d, repeat=2)])
    with pytest.raises(InvalidInputError, match="streaming's shuffles are py1e, py1s"):
        StreamingDataset(local=d, shuffle_algo="py3s")
    with pytest.raises(InvalidInputError, match="partition_algo must be one of orig, relaxed"):
        StreamingDataset(local=d, partition_algo="tree")
    with pytest.raises(InvalidInputError, match="stratified"):
        StreamingDataset(local=d, batching_method="stratified")
    with pytest.raises(InvalidInputError, match="string like '10k'"):
        StreamingDataset(local=d, epoch_size="infk")
    with pytest.raises(InvalidInputError, match="shuffle_seed"):
        StreamingDataset(local=d, shuffle_seed="1")
    with pytest.raises(InvalidInputError, match="batch_size"):
        StreamingDataset(local=d, batch_size="4")
    with pytest.raises(InvalidInputError, match="`proportion` must be non-negative"):
        Stream(local=d, proportion="1")


def test_torch_dataloader_with_workers_keeps_the_order(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    write_ours(tmp_path / "d", "mdstext", 30, "mds", size_limit=200)
    ds = StreamingDataset(local=str(tmp_path / "d"), batch_size=4)
    assert isinstance(ds, IterableDataset)
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    ids = torch.cat([b["id"] for b in loader]).tolist()
    assert ids == list(range(30))


def test_import_without_torch(tmp_path: Path) -> None:
    write_ours(tmp_path / "d", "mdstext", 5, "mds")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from lmdata.compat.streaming import StreamingDataset\n"
        f"ds = StreamingDataset(local={str(tmp_path / 'd')!r})\n"
        "print(len(list(ds)), [c.__name__ for c in type(ds).__mro__])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("5 ") and "IterableDataset" not in out.stdout


@pytest.mark.parametrize(
    "env, replication, want",
    [  # (WORLD_SIZE, LOCAL_WORLD_SIZE, RANK) -> (nodes, ranks per node, node, rank of node)
        ((8, 4, 5), None, (2, 4, 1, 1)),
        ((8, 4, 5), 2, (1, 4, 0, 2)),  # 4 groups of 2 ranks: one node of 4
        ((8, 4, 7), 4, (1, 2, 0, 1)),  # 2 groups: fewer than a node's ranks, one node
        ((8, 2, 6), 2, (2, 2, 1, 1)),
    ],
)
def test_world_from_the_environment_and_replication(
    monkeypatch: pytest.MonkeyPatch, env: tuple[int, int, int], replication: Any, want: tuple
) -> None:
    from lmdata.compat._streaming_dataset import _world

    for name, value in zip(("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK"), env, strict=True):
        monkeypatch.setenv(name, str(value))
    w = _world(replication, workers=False)
    assert (w.nodes, w.ranks_per_node, w.node, w.rank_of_node) == want
    with pytest.raises(InvalidInputError, match="divisible by replication=3"):
        _world(3, workers=False)
