"""``lmdata explain``: a step's rows, from options or a saved Loader state."""

from __future__ import annotations

import json

from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.loader import Loader
from tests.loader.conftest import random_seqs, write_flat


def test_the_cli_prints_a_steps_rows(tmp_path):
    docs = random_seqs(6, 80, 30)
    write_flat(tmp_path / "d.zarr", docs)
    args = ["explain", str(tmp_path / "d.zarr"), "--seq-len", "16", "--global-batch-size", "4"]
    res = CliRunner().invoke(cli, [*args, "--mode", "bestfit", "--step", "5"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "step 5: 4 rows of 16 tokens" and len(lines) == 5
    loader = Loader(str(tmp_path / "d.zarr"), seq_len=16, global_batch_size=4, mode="bestfit")
    first = loader.explain(5)[0][0]
    assert lines[1].startswith(f"row 0: doc {first.document} [{first.offset}:")
    res = CliRunner().invoke(cli, [*args, "--mode", "bestfit", "--step", "5", "--json"])
    assert json.loads(res.output)["rows"] == loader.explain(5).to_json()["rows"]


def test_the_cli_takes_a_saved_state(tmp_path):
    docs = random_seqs(7, 80, 30)
    src = write_flat(tmp_path / "d.zarr", docs)
    loader = Loader(src, seq_len=16, global_batch_size=4, mode="bestfit", seed=3, block_rows=8)
    loader.step = 11
    (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
    res = CliRunner().invoke(
        cli,
        ["explain", str(tmp_path / "d.zarr"), "--state", str(tmp_path / "state.json"), "--json"],
    )
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["step"] == 11 and got["rows"] == loader.explain(11).to_json()["rows"]
    res = CliRunner().invoke(cli, ["explain", str(tmp_path / "d.zarr"), "--step", "1"])
    assert res.exit_code != 0 and "--seq-len" in res.output
