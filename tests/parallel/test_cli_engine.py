"""--engine and --address on the CLI verbs: same output bytes, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmdata import _provenance as provenance
from lmdata.cli.main import cli


def _tree(p: Path) -> dict[str, bytes]:
    """Every file's bytes; in the metadata that records provenance, the command line (which
    names the engine and the output path) is blanked: everything else must be identical."""
    out = {}
    for f in sorted(p.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            if f.name in (".zattrs", "zarr.json", "index.json"):
                meta = json.loads(data)
                if isinstance(meta.get(provenance.KEY), dict):
                    assert "--engine" in meta[provenance.KEY]["command"]
                    meta[provenance.KEY]["command"] = ""
                data = json.dumps(meta, sort_keys=True).encode()
            elif f.name == "lmdata-manifest":  # it hashes those files too: left out of theirs
                meta = json.loads(data)
                meta["files"] = [
                    e
                    for e in meta["files"]
                    if not e["name"].endswith((".zattrs", "zarr.json", "index.json"))
                ]
                data = json.dumps(meta, sort_keys=True).encode()
            out[str(f.relative_to(p))] = data
    return out


def test_tokenize_and_convert_engines_give_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = "".join(json.dumps({"text": f"doc {i} " * (i % 7 + 1)}) + "\n" for i in range(700))
    outs = {}
    for engine in ("inprocess", "processes"):
        (tmp_path / engine).mkdir()
        monkeypatch.chdir(tmp_path / engine)
        Path("a.jsonl").write_text(lines)
        args = ["tokenize", "a.jsonl", "tok", "--to", "flat-tokens", "--batch-docs", "50"]
        res = CliRunner().invoke(cli, [*args, "--engine", engine, "--workers", "2", "-q"])
        assert res.exit_code == 0, res.output
        conv = ["convert", "tok", "mds", "--to", "mds", "--split", "train", "-q"]
        res = CliRunner().invoke(cli, [*conv, "--engine", engine, "--workers", "2"])
        assert res.exit_code == 0, res.output
        outs[engine] = _tree(Path("."))
    assert outs["inprocess"] == outs["processes"]
    assert any(k.startswith("mds/") for k in outs["inprocess"])


def test_address_without_ray_engine_is_a_usage_error(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "x"}\n')
    res = CliRunner().invoke(
        cli, ["tokenize", str(src), str(tmp_path / "o"), "--to", "flat-tokens", "--address", "auto"]
    )
    assert res.exit_code != 0
    assert "--engine ray" in res.output


def test_engine_option_is_on_every_pipeline_verb() -> None:
    for verb in ("tokenize", "convert", "tag", "dedupe", "mix"):
        res = CliRunner().invoke(cli, [verb, "--help"])
        assert "--engine" in res.output and "--address" in res.output, verb
