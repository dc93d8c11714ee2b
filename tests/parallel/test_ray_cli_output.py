"""A CLI run on Ray prints lmdata's lines only: Ray's own log lines and warnings (its token
authentication notice, "Started a local Ray instance") appear with --verbose alone. A real
local Ray, started by the command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")


def _tokenize(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i} " * 9}) + "\n" for i in range(300)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # Ray's defaults
    env.pop("LMDATA_RAY_VERBOSE", None)
    args = ["tokenize", str(src), str(tmp_path / "out"), "--to", "flat-tokens", "-q"]
    # address local: a new instance of our own, never another test's cluster
    args += ["--engine", "ray", "--address", "local", "--workers", "2", "--overwrite", *extra]
    return subprocess.run(
        [sys.executable, "-m", "lmdata.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )


def test_a_ray_run_prints_only_lmdata_lines(tmp_path: Path) -> None:
    out = _tokenize(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # -q: no progress, and nothing of Ray's
    assert out.stdout.startswith("documents read 300, written 300")
    loud = _tokenize(tmp_path, "--verbose")
    assert loud.returncode == 0, loud.stderr
    assert "Ray" in loud.stderr  # asked for: Ray's own lines are there


def test_engine_help_says_what_ray_costs() -> None:
    from click.testing import CliRunner

    from lmdata.cli.main import cli

    for verb in ("tokenize", "convert", "tag", "dedupe", "mix"):
        res = CliRunner().invoke(cli, [verb, "--help"], terminal_width=400)
        flat = " ".join(res.output.split())
        assert "starting a local instance took 5-15 s" in flat, verb
        assert "--verbose" in flat, verb
