"""Acceptance checks of issue 13 that no other test pinned: ``--engine ray --address ADDR``
reaches the Ray engine from every pipeline verb (no cluster needed: the engine is replaced by
one that names the address it was given and stops)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.errors import InvalidInputError

DOLMA = Path(__file__).parent.parent / "data" / "dolma"
ADDRESS = "ray://head.example:10001"


@pytest.fixture()
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Every address a Ray engine was made with; making one stops the job with an lmdata error
    (so the CLI reports it as such and nothing runs)."""
    import lmdata.parallel.ray as ray_engine

    made: list[str | None] = []

    class Fake:
        def __init__(self, workers: int | None = None, *, address: str | None = None, **kw):
            made.append(address)
            raise InvalidInputError(f"fake Ray engine asked for cluster {address}")

    monkeypatch.setattr(ray_engine, "RayExecutor", Fake)
    return made


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def test_every_pipeline_verb_hands_the_address_to_the_ray_engine(
    fake_ray: list[str | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(DOLMA / "dataset", "dataset")
    shutil.copytree(DOLMA / "configs", "configs")
    lines = "".join(json.dumps({"text": f"doc {i} " * (i % 5 + 1)}) + "\n" for i in range(400))
    Path("a.jsonl").write_text(lines)
    with lmdata.writer("tok.zarr", "flat-tokens") as w:
        for i in range(3000):
            w.write(np.arange(1, i % 40 + 2))
    docs = "dataset/documents/*.jsonl.gz"
    ray = ["--engine", "ray", "--address", ADDRESS]
    verbs = {
        "tokenize": ["tokenize", "a.jsonl", "out.zarr", "--to", "flat-tokens", "-q", *ray],
        "convert": ["convert", "tok.zarr", "out.mds", "--to", "mds", "--split", "train", *ray],
        "tag": ["tag", "-d", docs, "-t", "char_length_v1", "-q", *ray],
        "dedupe": ["dedupe", "-d", docs, "--dedupe.paragraphs.attribute_name", "p", "-q", *ray],
        "mix": ["-c", "configs/mix.yaml", "mix", *ray],
    }
    for verb, args in verbs.items():
        before = len(fake_ray)
        code, out = _run(*args)
        assert code == 2 and f"fake Ray engine asked for cluster {ADDRESS}" in out, (verb, out)
        assert fake_ray[before:] == [ADDRESS], verb
    assert not Path("out.zarr").exists() and not Path("out.mds").exists()
