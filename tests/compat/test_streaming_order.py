"""compat.streaming's sample order against mosaicml-streaming 0.13.0's own, id for id.

One subprocess asks streaming (``generate_work``, the function its workers call) for the
whole epoch array of many cases (shuffle algorithms, seeds, canonical nodes, block sizes,
worlds, epochs, resume points, stream weights); lmdata computes the same cases and must agree
on every entry, -1 padding included.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmdata.compat import _streaming_epoch as E
from lmdata.compat._streaming_dataset import _World
from lmdata.compat.streaming import MDSWriter, Stream, StreamingDataset
from tests.formats.mds_samples import streaming_python

pytestmark = pytest.mark.skipif(
    streaming_python() is None,
    reason="mosaicml-streaming venv .venv/extra-streaming is absent (make install creates it)",
)

# name -> (samples, size_limit): "a" has an empty shard then one sample per shard, "m" shards
# of 11 (the last short), "one" a single shard
DATASETS = {"a": (97, 120), "m": (97, 300), "b": (40, 200), "c": (13, 70), "one": (30, 1 << 20)}


def _write(root: Path) -> dict[str, str]:
    paths = {}
    for name, (n, limit) in DATASETS.items():
        out = root / name
        offset = 1000 * list(DATASETS).index(name)
        with MDSWriter(out=str(out), columns={"id": "int"}, size_limit=limit) as w:
            for i in range(n):
                w.write({"id": offset + i})
        paths[name] = str(out)
    return paths


def _cases(p: dict[str, str]) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []

    def add(world: tuple[int, int, int], epoch: int = 0, **kw: Any) -> None:
        case: dict[str, Any] = {"world": list(world), "epoch": epoch}
        for key in ("streams", "sample_in_epoch", "initial_nodes"):
            if key in kw:
                case[key] = kw.pop(key)
        if "streams" not in case:
            case["local"] = p[kw.pop("data", "a")]
        case["kwargs"] = kw
        cases.append(case)

    for algo in ("py1e", "py1s", "py1br", "py2s", "naive"):
        for seed, ncn, block, world, batch in [
            (9176, 1, 16, (1, 1, 1), 4),
            (3, 4, 10, (2, 2, 2), 3),
            (7, 2, 30, (1, 4, 1), 5),
            (11, 8, 7, (4, 1, 2), 2),
        ]:
            add(world, epoch=seed % 3, shuffle=True, shuffle_algo=algo, shuffle_seed=seed,
                num_canonical_nodes=ncn, shuffle_block_size=block, batch_size=batch,
                data="m")  # fmt: skip
    # the defaults: py1e, seed 9176, block max(4M // ncn, 256Ki), one canonical node per node
    add((1, 1, 1), shuffle=True, batch_size=8)
    add((2, 2, 1), epoch=1, shuffle=True, shuffle_algo="py1s", num_canonical_nodes=4, batch_size=2)
    add((2, 1, 1), epoch=1, shuffle=True, batch_size=3, data="one")
    # no shuffle, several worlds, resumes (sample_in_epoch) and padding
    add((1, 1, 1), batch_size=1)
    add((2, 2, 3), num_canonical_nodes=4, batch_size=4)
    add((3, 1, 1), num_canonical_nodes=3, batch_size=2, data="c")
    add((1, 2, 2), shuffle=True, num_canonical_nodes=2, shuffle_block_size=20, batch_size=4,
        sample_in_epoch=30)  # fmt: skip
    add((2, 1, 2), epoch=2, shuffle=True, shuffle_seed=5, num_canonical_nodes=2,
        shuffle_block_size=9, batch_size=2, sample_in_epoch=11)  # fmt: skip
    # resumed on another number of nodes (relaxed partition from the initial run's)
    add((1, 2, 1), shuffle=True, num_canonical_nodes=4, shuffle_block_size=12, batch_size=4,
        initial_nodes=2, sample_in_epoch=16)  # fmt: skip
    add((4, 1, 1), num_canonical_nodes=2, batch_size=2, initial_nodes=2)
    # streams: proportion (with epoch_size), repeat, choose, unweighted; fixed sampling; granules
    abc = [{"local": p["a"]}, {"local": p["b"]}, {"local": p["c"]}]
    weighted = [{**abc[0], "proportion": 0.5}, {**abc[1], "proportion": 0.3},
                {**abc[2], "proportion": 0.2}]  # fmt: skip
    mixed = [{**abc[0], "repeat": 0.4}, {**abc[1], "choose": 55}, abc[2]]
    add((1, 1, 1), streams=abc, shuffle=True, shuffle_seed=1, num_canonical_nodes=2,
        shuffle_block_size=25, batch_size=4)  # fmt: skip
    add((1, 1, 1), streams=weighted, epoch_size=333, shuffle=True, num_canonical_nodes=3,
        shuffle_block_size=40, batch_size=6)  # fmt: skip
    add((2, 1, 1), epoch=1, streams=weighted, epoch_size="0.2k", batch_size=5,
        num_canonical_nodes=2)  # fmt: skip
    add((1, 2, 1), epoch=1, streams=mixed, shuffle=True, shuffle_seed=42, num_canonical_nodes=2,
        shuffle_block_size=17, batch_size=3)  # fmt: skip
    add((1, 1, 2), epoch=3, streams=mixed, shuffle=True, sampling_method="fixed",
        num_canonical_nodes=1, shuffle_block_size=50, batch_size=4)  # fmt: skip
    add((1, 1, 1), epoch=1, streams=mixed, shuffle=True, sampling_granularity=3,
        num_canonical_nodes=2, shuffle_block_size=30, batch_size=2)  # fmt: skip
    add((1, 1, 1), streams=abc, epoch_size=150, shuffle=True, shuffle_algo="py1br",
        num_canonical_nodes=2, shuffle_block_size=20, batch_size=4)  # fmt: skip
    # per_stream batching: every global batch from one stream, streams interleaved at random
    per = {"batching_method": "per_stream"}
    add((1, 1, 1), streams=weighted, epoch_size=200, shuffle=True, num_canonical_nodes=2,
        shuffle_block_size=40, batch_size=4, **per)  # fmt: skip
    add((2, 1, 2), epoch=1, streams=mixed, shuffle=True, shuffle_seed=8, num_canonical_nodes=2,
        shuffle_block_size=25, batch_size=3, sample_in_epoch=14, **per)  # fmt: skip
    add((1, 2, 1), streams=abc, num_canonical_nodes=1, batch_size=2, **per)
    add((1, 1, 3), epoch=2, streams=mixed, shuffle=True, shuffle_algo="py1s",
        sampling_method="fixed", num_canonical_nodes=1, batch_size=5, **per)  # fmt: skip
    return cases


def _streaming(job: dict[str, Any]) -> dict[str, Any]:
    helper = Path(__file__).with_name("streaming_compat_helper.py")
    out = subprocess.run(
        [streaming_python(), str(helper), json.dumps(job)],  # type: ignore[list-item]
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _iterations(p: dict[str, str]) -> list[dict[str, Any]]:
    """Whole runs through ``__iter__``: two epochs, then a fresh dataset resumed after k."""
    mix = [{"local": p["a"], "proportion": 2}, {"local": p["c"], "proportion": 1}]
    return [
        {"op": "iterate", "local": p["a"], "k": 13,
         "kwargs": {"shuffle": True, "shuffle_seed": 17, "batch_size": 4}},
        {"op": "iterate", "streams": mix, "k": 9,
         "kwargs": {"shuffle": True, "epoch_size": 120, "batch_size": 3, "shuffle_block_size": 30}},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def streaming_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    paths = _write(tmp_path_factory.mktemp("order"))
    cases, runs = _cases(paths), _iterations(paths)
    job = {"op": "batch", "jobs": [{"op": "epochs", "cases": cases}, *runs]}
    theirs, *ran = _streaming(job)["results"]
    return {
        "epochs": list(zip(cases, theirs["cases"], strict=True)),
        "runs": list(zip(runs, ran, strict=True)),
    }


@pytest.fixture(scope="module")
def compared(streaming_runs: dict[str, Any]) -> list[tuple[dict, dict]]:
    return streaming_runs["epochs"]


def _dataset(case: dict[str, Any]) -> Any:
    kw = dict(case["kwargs"])
    if "streams" in case:
        kw["streams"] = [Stream(**s) for s in case["streams"]]
    else:
        kw["local"] = case["local"]
    return StreamingDataset(**kw)


def _ours(case: dict[str, Any]) -> tuple[np.ndarray, Any]:
    ds = _dataset(case)
    nodes, ranks, workers = case["world"]
    if ds.num_canonical_nodes is None:
        ds.num_canonical_nodes = nodes
    ds._default_block_size()
    ids = E.epoch_ids(
        ds._order(),
        case["epoch"],
        case.get("sample_in_epoch", 0),
        E.Layout(ds.num_canonical_nodes, nodes, ranks, workers, case.get("initial_nodes")),
    )
    return ids, ds


def test_every_case_matches_streaming(compared: list[tuple[dict, dict]]) -> None:
    wrong = []
    for k, (case, theirs) in enumerate(compared):
        ids, ds = _ours(case)
        got = (ds.epoch_size, len(ds), ids.tolist())
        if got != (theirs["epoch_size"], theirs["len"], theirs["ids"]):
            wrong.append((k, case))
    assert not wrong, f"{len(wrong)} of {len(compared)} cases differ: {wrong}"


def test_the_order_is_not_trivially_equal(compared: list[tuple[dict, dict]]) -> None:
    """The cases differ from one another, so matching them all pins the algorithms down."""
    shuffled = [str(t["ids"]) for c, t in compared if c["kwargs"].get("shuffle")]
    assert len(set(shuffled)) == len(shuffled)


def test_this_process_reads_its_slice(compared: list[tuple[dict, dict]]) -> None:
    """``work`` picks (node, rank, worker) out of the epoch and drops the padding."""
    case, theirs = next((c, t) for c, t in compared if c["world"] == [2, 2, 2])
    ids, ds = _ours(case)
    full = np.array(theirs["ids"]).reshape(ids.shape)
    world = _World(2, 2, 2, node=1, rank_of_node=0, worker=1)
    mine = ds.work(case["epoch"], 0, world)
    want = full[1, 0, 1].reshape(-1)
    assert mine.tolist() == want[want >= 0].tolist()


def test_iterating_and_resuming_match_streaming(streaming_runs: dict[str, Any]) -> None:
    for job, theirs in streaming_runs["runs"]:
        ds = _dataset(job)
        assert [[s["id"] for s in ds] for _ in range(2)] == theirs["epochs"], job
        ds = _dataset(job)
        it = iter(ds)
        for _ in range(job["k"]):
            next(it)
        assert ds.state_dict(job["k"], False) == theirs["state"]
        fresh = _dataset(job)
        fresh.load_state_dict(theirs["state"])
        assert [s["id"] for s in fresh] == theirs["rest"]
