"""torch resume: the plain ``DataLoader(loader.to_torch())`` is right without workers and, with
workers, its ``loader.state_dict()`` is refused naming the right patterns (never a silent
restart at step 0); ``torch_loader()`` and torchdata's ``StatefulDataLoader`` resume exactly,
with 0 to 3 workers and another worker count after the resume; a tiny GPT trained through two
workers, SIGKILLed after step 20 of 40 and resumed, sees the same batches and losses bit for
bit as the uninterrupted run."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from lmdata.errors import InvalidInputError
from lmdata.loader import Loader
from tests.loader.conftest import write_flat

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings(
    "ignore:This DataLoader will create:UserWarning",
    "ignore:'set_vital' is deprecated:UserWarning",
)
from torch.utils.data import DataLoader  # noqa: E402

CHILD = Path(__file__).with_name("torch_resume_child.py")


def _stateful():
    return pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


@pytest.fixture()
def make(dataset):
    r, _ = dataset
    return lambda: Loader(r, seq_len=8, global_batch_size=6, seed=7, rank=0, world_size=1)


def _same(t: dict, n: dict) -> bool:
    return t.keys() == n.keys() and all(np.array_equal(t[k].numpy(), n[k]) for k in n)


def _check(got: list, ref: Loader, first: int = 0) -> None:
    for s, b in enumerate(got, start=first):
        assert _same(b, ref.batch(s)), s


def _take(dl, n: int) -> tuple[list, dict]:
    """``n`` batches of ``dl`` and its state after them (JSON round trip); the iterator and
    its workers are shut down before returning."""
    it = iter(dl)
    got = [next(it) for _ in range(n)]
    state = json.loads(json.dumps(dl.state_dict()))
    del it
    gc.collect()
    return got, state


def test_the_plain_pattern_without_workers_advances_the_loader(make):
    ref, a = make(), make()
    got = list(islice(DataLoader(a.to_torch(), batch_size=None, num_workers=0), 5))
    assert a.step == 5
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    more = list(islice(DataLoader(b.to_torch(), batch_size=None), 4))
    _check(got + more, ref)


@pytest.mark.parametrize("k", [0, 2])
def test_a_checkpoint_loaded_after_the_dataloader_is_built_is_followed(make, k):
    """Training scripts build the DataLoader, then restore the checkpoint: the dataset made
    by to_torch() before the load must start at the loaded step, not at step 0."""
    ref, a = make(), make()
    list(islice(DataLoader(a.to_torch(), batch_size=None), 5))
    saved = json.loads(json.dumps(a.state_dict()))
    b = make()
    ds = b.to_torch()
    plain = DataLoader(ds, batch_size=None, num_workers=k)
    b.load_state_dict(saved)  # after to_torch() and the DataLoader
    _check(list(islice(plain, 4)), ref, 5)
    if not k:  # without workers the loader counts what was handed out, from the loaded step
        assert b.step == 9
    StatefulDataLoader = _stateful()
    c = make()
    dl = StatefulDataLoader(c.to_torch(), batch_size=None, num_workers=k)
    c.load_state_dict(saved)
    got, state = _take(dl, 3)
    _check(got, ref, 5)
    d = make()
    d.load_state_dict(state)
    assert d.step == 8


def test_the_plain_pattern_with_workers_refuses_the_loader_state(make):
    a = make()
    dl = DataLoader(a.to_torch(), batch_size=None, num_workers=2)
    _take_plain = list(islice(dl, 3))
    assert len(_take_plain) == 3
    with pytest.raises(InvalidInputError, match="run copies of it") as e:
        a.state_dict()  # today's main: a state at step 0, which would restart the data
    assert "loader.torch_loader(num_workers=k)" in str(e.value)
    assert "StatefulDataLoader(loader.to_torch(), batch_size=None" in str(e.value)
    # torch_loader on the same loader is right again once the position is set anew
    a.load_state_dict(make().state_dict())
    tl = a.torch_loader(num_workers=2)
    assert len(list(islice(tl, 3))) == 3 and a.state_dict()["step"] == 3


def test_spawned_workers_are_detected_too(make):
    a = make()
    dl = DataLoader(
        a.to_torch(), batch_size=None, num_workers=1, multiprocessing_context="spawn"
    )  # the shared byte reaches a spawned worker through torch's pickling
    assert len(list(islice(dl, 2))) == 2
    with pytest.raises(InvalidInputError, match="run copies of it"):
        a.state_dict()


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_stateful_dataloader_resumes_exactly_with_any_worker_count(make, k):
    StatefulDataLoader = _stateful()
    ref, a = make(), make()
    got, state = _take(StatefulDataLoader(a.to_torch(), batch_size=None, num_workers=k), 5)
    _check(got, ref)
    if k:
        with pytest.raises(InvalidInputError, match=r"dl\.state_dict"):
            a.state_dict()
    else:  # without workers the dataset runs here and advances the loader
        assert a.state_dict()["step"] == 5
    # the same worker count: torchdata restores each worker's own state
    dl = StatefulDataLoader(make().to_torch(), batch_size=None, num_workers=k)
    dl.load_state_dict(state)
    _check(list(islice(dl, 6)), ref, 5)
    # another worker count: the loader takes the global position from the workers' states
    for k2 in ((k + 1) % 4, (k + 3) % 4):
        b = make()
        b.load_state_dict(state)
        assert b.step == 5
        _check(
            list(islice(StatefulDataLoader(b.to_torch(), batch_size=None, num_workers=k2), 6)),
            ref,
            5,
        )
    gc.collect()


def test_stateful_dataloader_snapshots_every_n_steps_and_a_finite_pass_ends(dataset, make):
    StatefulDataLoader = _stateful()
    ref = make()
    for n in (4, 7):  # states saved 1 and 1 steps after a snapshot (every 3 steps)
        a = make()
        dl = StatefulDataLoader(
            a.to_torch(), batch_size=None, num_workers=2, snapshot_every_n_steps=3
        )
        got, state = _take(dl, n)
        again = StatefulDataLoader(
            make().to_torch(), batch_size=None, num_workers=2, snapshot_every_n_steps=3
        )
        again.load_state_dict(state)
        _check(got + list(islice(again, 4)), ref)
        b = make()
        b.load_state_dict(state)
        assert b.step == n
    r, _ = dataset
    finite = Loader(r, seq_len=8, global_batch_size=40, epochs=1, rank=0, world_size=1)
    n = len(finite)
    dl = StatefulDataLoader(finite.to_torch(), batch_size=None, num_workers=2)
    got, state = _take(dl, n - 2)
    rest = StatefulDataLoader(
        Loader(r, seq_len=8, global_batch_size=40, epochs=1, rank=0, world_size=1).to_torch(),
        batch_size=None,
        num_workers=2,
    )
    rest.load_state_dict(state)
    _check(got + list(rest), finite)
    ended = json.loads(json.dumps(rest.state_dict()))
    done = Loader(r, seq_len=8, global_batch_size=40, epochs=1, rank=0, world_size=1)
    done.load_state_dict(ended)
    assert done.step == n and len(list(done)) == n  # the pass is over: a new one
    gc.collect()


def test_another_worker_count_through_the_dataloader_state_is_a_clear_error(make):
    StatefulDataLoader = _stateful()
    _, state = _take(StatefulDataLoader(make().to_torch(), batch_size=None, num_workers=2), 3)
    dl = StatefulDataLoader(make().to_torch(), batch_size=None, num_workers=3)
    dl.load_state_dict(state)
    with pytest.raises(InvalidInputError, match=r"loader\.load_state_dict\(\)"):
        next(iter(dl))
    gc.collect()


# ---- the acceptance run: a tiny GPT, SIGKILLed after step 20 of 40 ---------------------------


def _run(tmp: Path, job: dict, name: str) -> subprocess.CompletedProcess:
    # output to files, not pipes: the DataLoader workers of a killed run outlive it briefly
    # and would hold a pipe open
    with open(tmp / f"{name}.out", "w") as out:
        return subprocess.run(
            [sys.executable, str(CHILD), json.dumps(job)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
            cwd=Path(__file__).resolve().parents[2],
        )


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    rng = np.random.default_rng(5)
    seqs = [rng.integers(1, 64, rng.integers(5, 40)) for _ in range(400)]
    write_flat(root / "tok.zarr", seqs)
    return str(root / "tok.zarr")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokens):
    """The 40 steps' log of a run never stopped (either pattern serves the same batches to
    the same model, so one run is the reference for both)."""
    root = tmp_path_factory.mktemp("whole")
    job = {"data": tokens, "pattern": "torch_loader", "steps": 40, "log": str(root / "w.jsonl")}
    done = _run(root, job, "whole")
    assert done.returncode == 0, (root / "whole.out").read_text()[-3000:]
    return _log(root / "w.jsonl")


@pytest.mark.parametrize("pattern", ["torch_loader", "stateful"])
def test_a_tiny_gpt_killed_after_step_20_of_40_resumes_bit_for_bit(
    tmp_path, tokens, uninterrupted, pattern
):
    if pattern == "stateful":
        _stateful()
    base = {"data": tokens, "pattern": pattern, "steps": 40}
    cut = tmp_path / "cut.jsonl"
    ckpt = str(tmp_path / "ckpt.pt")
    job = {**base, "log": str(cut), "ckpt": ckpt, "kill_at": 20}
    killed = _run(tmp_path, job, "killed")
    assert killed.returncode == -signal.SIGKILL, (tmp_path / "killed.out").read_text()[-3000:]
    assert len(_log(cut)) == 20  # the workers had prefetched past step 20: none of it counts
    resumed = _run(tmp_path, {**job, "kill_at": None, "resume": True}, "resumed")
    assert resumed.returncode == 0, (tmp_path / "resumed.out").read_text()[-3000:]
    reference = uninterrupted
    assert [x["step"] for x in reference] == list(range(40))
    assert _log(cut) == reference  # batches and losses (float.hex) equal, step for step
    assert len({x["batch"] for x in reference}) == 40  # 40 different batches, none replayed


def test_the_plain_pattern_with_workers_is_refused_at_the_checkpoint(tmp_path, tokens):
    job = {
        "data": tokens,
        "pattern": "plain",
        "steps": 40,
        "log": str(tmp_path / "plain.jsonl"),
        "ckpt": str(tmp_path / "ckpt.pt"),
        "kill_at": 20,
    }
    run = _run(tmp_path, job, "plain")
    said = (tmp_path / "plain.out").read_text()
    assert run.returncode == 3, said[-3000:]
    assert "REFUSED" in said and "loader.torch_loader(num_workers=k)" in said
    assert not Path(job["ckpt"]).exists()  # no checkpoint that would restart the data
