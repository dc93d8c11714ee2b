"""torch: real DataLoaders with 0, 1 and 3 workers give exactly the loader's batches."""

from __future__ import annotations

import subprocess
import sys
from itertools import islice

import numpy as np
import pytest

from lmdata.loader import Loader

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402


def _same(t: dict, n: dict) -> bool:
    return t.keys() == n.keys() and all(np.array_equal(t[k].numpy(), n[k]) for k in n)


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_dataloader_workers_yield_exactly_the_loaders_batches(dataset, workers):
    r, _ = dataset
    finite = Loader(r, seq_len=16, global_batch_size=40, seed=2, epochs=1, rank=0, world_size=1)
    finite.step = 2
    got = list(DataLoader(finite.to_torch(), batch_size=None, num_workers=workers))
    assert len(got) == len(finite) - 2  # none lost, none repeated, the padded last one kept
    for s, b in enumerate(got, start=2):
        assert _same(b, finite.batch(s)), s
    endless = Loader(r, seq_len=8, global_batch_size=6, seed=2, rank=0, world_size=1)
    dl = DataLoader(endless.to_torch(), batch_size=None, num_workers=workers)
    for s, b in enumerate(islice(dl, 11)):
        assert _same(b, endless.batch(s)), s


def test_torch_loader_state_counts_received_batches_and_resumes_elastically(dataset):
    r, _ = dataset

    def make():
        return Loader(r, seq_len=8, global_batch_size=6, seed=7, rank=0, world_size=1)

    ref = make()
    a = make()
    tl = a.torch_loader(num_workers=3)
    got = list(islice(tl, 5))
    assert a.step == 5  # what the main process received, not what workers prefetched
    state = a.state_dict()
    b = make()
    b.load_state_dict(state)
    more = list(islice(b.torch_loader(num_workers=1), 4))  # another worker count
    for s, x in enumerate(got + more):
        assert _same(x, ref.batch(s)), s
    finite = Loader(r, seq_len=8, global_batch_size=6, epochs=1, rank=0, world_size=1)
    assert len(finite.torch_loader()) == len(finite)


class Naive(IterableDataset):
    """The classic mistake: every worker iterates the whole loader."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for b in self.loader:
            yield {k: torch.from_numpy(v) for k, v in b.items()}


def test_naive_per_worker_iteration_is_refused(dataset):
    r, _ = dataset
    loader = Loader(r, seq_len=8, global_batch_size=6, rank=0, world_size=1)
    it = iter(DataLoader(Naive(loader), batch_size=None, num_workers=2))
    try:
        with pytest.raises(Exception, match="every worker would yield every batch"):
            next(it)
    finally:
        # the workers stopped here, not whenever the iterator (held by the exception's
        # traceback) is collected: torch then waits 5 s per worker (a teardown of 10 s)
        it._shutdown_workers()


def test_importing_lmdata_does_not_import_torch():
    code = (
        "import sys, lmdata, lmdata.loader; lmdata.Loader; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
