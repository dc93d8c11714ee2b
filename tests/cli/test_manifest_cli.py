"""The manifest on the command line: ``lmdata manifest PATH [--check]``, ``validate --deep``
and what ``info`` shows."""

from __future__ import annotations

import json

import orjson
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.storage.manifest import NAME, SUFFIX


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _mds(path, manifest=True):
    with lmdata.writer(path, "mds", manifest=manifest, size_limit=2000) as w:
        for i in range(200):
            w.write({"id": i, "text": f"document {i} " * 3})
    return path


def test_manifest_for_a_dataset_another_tool_wrote_then_check(tmp_path):
    p = _mds(tmp_path / "d.mds", manifest=False)
    assert not (p / NAME).exists()
    r = run("manifest", str(p), "-q")
    assert r.exit_code == 0, r.output
    m = json.loads((p / NAME).read_bytes())
    assert m["format"] == "mds" and m["records"] == 200
    assert len(m["files"]) == len(list(p.iterdir())) - 1
    r = run("manifest", str(p), "--check")
    assert r.exit_code == 0 and "matches its manifest" in r.output and "200 records" in r.output
    shard = sorted(p.glob("shard.*"))[3]
    data = bytearray(shard.read_bytes())
    data[10] ^= 4
    shard.write_bytes(bytes(data))
    r = run("manifest", str(p), "--check")
    assert r.exit_code == 1 and f"{shard}: bytes 0-" in r.output


def test_manifest_refuses_an_invalid_dataset_and_an_existing_manifest(tmp_path):
    p = _mds(tmp_path / "d.mds", manifest=False)
    shard = sorted(p.glob("shard.*"))[0]
    shard.write_bytes(shard.read_bytes()[:-5])
    r = run("manifest", str(p))
    assert r.exit_code == 2 and "not valid, so no manifest was written" in r.output
    assert not (p / NAME).exists()
    q = _mds(tmp_path / "e.mds")
    r = run("manifest", str(q))
    assert r.exit_code == 2 and "--overwrite" in r.output
    r = run("manifest", str(q), "--overwrite", "-q")
    assert r.exit_code == 0


def test_check_without_a_manifest_says_how_to_write_one(tmp_path):
    p = _mds(tmp_path / "d.mds", manifest=False)
    r = run("manifest", str(p), "--check")
    assert r.exit_code == 2 and "lmdata manifest PATH" in r.output


def test_manifest_of_a_one_file_dataset_lists_its_index(tmp_path):
    p = tmp_path / "d.jsonl"
    with lmdata.writer(p, "modalities-jsonl", manifest=False) as w:
        for i in range(10):
            w.write({"text": str(i)})
    assert run("manifest", str(p), "-q").exit_code == 0
    m = json.loads((tmp_path / ("d.jsonl" + SUFFIX)).read_bytes())
    assert sorted(f["name"] for f in m["files"]) == ["d.idx", "d.jsonl"]
    assert m["records"] == 10


def test_validate_deep_and_plain(tmp_path):
    p = _mds(tmp_path / "d.mds")
    r = run("validate", str(p), "--deep")
    assert r.exit_code == 0 and "every byte matches its manifest" in r.output
    shard = sorted(p.glob("shard.*"))[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    assert run("validate", str(p)).exit_code in (0, 1)  # the format may see the flip
    r = run("validate", str(p), "--deep")
    assert r.exit_code == 1 and f"{shard}: bytes" in r.output
    (p / "stray").write_bytes(b"x")
    r = run("validate", str(p))
    assert r.exit_code == 1 and f"{p / 'stray'}: added" in r.output
    q = _mds(tmp_path / "e.mds", manifest=False)
    r = run("validate", str(q), "--deep")
    assert r.exit_code == 0 and "no manifest" in r.output


def test_info_shows_the_manifest(tmp_path):
    p = _mds(tmp_path / "d.mds")
    r = run("info", str(p))
    assert r.exit_code == 0 and "manifest:" in r.output and "made: 20" in r.output
    got = orjson.loads(run("info", str(p), "--json").output)
    assert got["manifest"]["records"] == 200
    q = _mds(tmp_path / "e.mds", manifest=False)
    assert orjson.loads(run("info", str(q), "--json").output)["manifest"] == "none"


def test_open_of_a_damaged_dataset_names_the_file_on_the_command_line(tmp_path):
    p = _mds(tmp_path / "d.mds")
    shard = sorted(p.glob("shard.*"))[2]
    shard.unlink()
    r = run("cat", str(p), "--limit", "1")
    assert r.exit_code == 2 and f"{shard}: deleted" in r.output and "verify=False" in r.output


# ---- every writing command leaves a manifest that validates ----------------------------------

TARGETS = ["flat-tokens", "atlas", "modalities", "modalities-jsonl", "mds", "dolma", "jsonl"]
ONE_FILE = {"modalities": ".pbin", "modalities-jsonl": ".jsonl", "jsonl": ".jsonl"}


def _manifest_of(path: str) -> dict:
    from lmdata._manifest import summary

    made = summary(path)
    assert isinstance(made, dict), (path, made)
    return made


def _cli_root(request, tmp_path, where: str) -> str:
    return request.getfixturevalue("s3_root") if where == "s3" else str(tmp_path)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_convert_tokenize_and_merge_on_the_command_line_write_manifests(request, tmp_path, where):
    root = _cli_root(request, tmp_path, where)
    src = tmp_path / "docs.jsonl"
    src.write_text(
        "".join(json.dumps({"id": str(i), "text": f"doc {i} " * 9}) + "\n" for i in range(40))
    )
    toks = f"{root}/toks.pbin"
    r = run("tokenize", str(src), toks, "--to", "modalities", "--no-eod", "-q", "--workers", "0")
    assert r.exit_code == 0, r.output
    for to in TARGETS:
        out = f"{root}/c-{to}{ONE_FILE.get(to, '')}"
        given = toks if to in ("flat-tokens", "modalities") else str(src)
        r = run("convert", given, out, "--to", to, "-q", "--workers", "0")
        assert r.exit_code == 0, (to, r.output)
        assert _manifest_of(out)["records"] == 40, to
        assert run("validate", out, "--deep", "-q").exit_code == 0, to
    r = run("merge", toks, f"{root}/c-modalities.pbin", "-o", f"{root}/m.pbin", "-q")
    assert r.exit_code == 0, r.output
    assert _manifest_of(f"{root}/m.pbin")["records"] == 80
    r = run("merge", f"{root}/c-atlas", f"{root}/c-atlas", "-o", f"{root}/m-atlas", "-q")
    assert r.exit_code == 0, r.output
    assert _manifest_of(f"{root}/m-atlas")["records"] == 80
    for out in (toks, f"{root}/m.pbin", f"{root}/m-atlas"):
        assert run("manifest", out, "--check").exit_code == 0, out
