"""JAX takes the Loader's numpy batches without a copy, and several hosts assemble a global
array from their ranks' slices (here one process: the same call, one device)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from lmdata.loader import Loader
from tests.loader.conftest import random_seqs, write_flat

jax = pytest.importorskip("jax")


@pytest.fixture()
def loader(tmp_path):
    src = write_flat(tmp_path / "a.zarr", random_seqs(3, 200))
    return Loader(src, seq_len=16, global_batch_size=8, rank=0, world_size=1, seed=1)


def test_device_put_aliases_the_batch_and_pooled_memory_is_never_reused_under_it(loader):
    held = []
    for step in range(24):  # more batches than the pool keeps blocks
        batch = loader.batch(step)
        for key, value in batch.items():
            x = jax.device_put(value, may_alias=True)
            assert x.unsafe_buffer_pointer() == value.ctypes.data, key  # no copy
            held.append((x, value.copy()))
        del batch, value
    # the aliased arrays keep their blocks: later batches went to other memory
    assert all(np.array_equal(np.asarray(x), ref) for x, ref in held)


def test_make_array_from_process_local_data_builds_the_global_batch(loader):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    batch = loader.batch(0)
    arr = jax.make_array_from_process_local_data(sharding, batch["inputs"])
    assert arr.shape == batch["inputs"].shape and arr.dtype == np.int32
    assert np.array_equal(np.asarray(arr), batch["inputs"])


def test_importing_lmdata_and_its_loader_does_not_import_jax():
    code = "import sys, lmdata, lmdata.loader; lmdata.Loader; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
