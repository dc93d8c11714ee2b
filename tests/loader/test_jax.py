"""JAX takes the Loader's numpy batches without a copy, and several hosts assemble a global
array from their ranks' slices (here one process: the same call, one device). JAX runs in a
child process: once imported it runs threads, and the test process forks DataLoader and
executor workers later."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from tests.loader.conftest import random_seqs, write_flat

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="jax is not installed (lmdata[jax])"
)

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    import lmdata

    loader = lmdata.Loader(sys.argv[1], seq_len=16, global_batch_size=8, rank=0, world_size=1)
    held = []
    for step in range(24):  # more batches than the pool keeps blocks
        batch = loader.batch(step)
        for key, value in batch.items():
            x = jax.device_put(value, may_alias=True)
            assert x.unsafe_buffer_pointer() == value.ctypes.data, ("copied", key)
            held.append((x, value.copy()))
        del batch, value
    # the aliased arrays keep their blocks: later batches went to other memory
    assert all(np.array_equal(np.asarray(x), ref) for x, ref in held), "overwritten"
    mesh = Mesh(np.array(jax.devices()), ("data",))
    batch = loader.batch(0)
    arr = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("data")), batch["inputs"]
    )
    assert arr.shape == batch["inputs"].shape and arr.dtype == np.int32
    assert np.array_equal(np.asarray(arr), batch["inputs"])
    print("ok")
    """
)


def test_jax_aliases_batches_and_assembles_the_global_array(tmp_path):
    write_flat(tmp_path / "a.zarr", random_seqs(3, 200))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "a.zarr")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_importing_lmdata_and_its_loader_does_not_import_jax():
    code = "import sys, lmdata, lmdata.loader; lmdata.Loader; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
