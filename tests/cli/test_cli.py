"""The CLI verbs that work for every format: info, validate, cat (and the demo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.formats.flat_tokens import Writer

SPEC = Path(__file__).parent.parent / "data" / "flat_tokens" / "spec_example.zarr"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def python_stdout(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (nothing imported yet)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout


def test_every_verb_has_help():
    res = run("--help")
    assert res.exit_code == 0
    verbs = [line.split()[0] for line in res.output.split("Commands:")[1].strip().splitlines()]
    assert {"info", "validate", "cat"} <= set(verbs)
    for v in verbs:
        r = run(v, "--help")
        assert r.exit_code == 0 and "Usage:" in r.output, v


def test_group_help_lists_every_verb_without_importing_them():
    from lmdata.cli.main import COMMANDS, SUMMARIES

    assert set(SUMMARIES) == set(COMMANDS)  # a new verb needs its one-line summary
    code = (
        "import sys; from lmdata.cli.main import cli\n"
        "try: cli(['--help'], prog_name='lmdata')\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('lmdata.cli.')))\n"
        "print('numpy' in sys.modules)"
    )
    out = python_stdout(code)
    # no verb module, and no numpy (the printed module list could never name it)
    assert out.strip().splitlines()[-2:] == ["['lmdata.cli.main']", "False"]
    listed = " ".join(out.split())
    for verb, summary in SUMMARIES.items():
        assert f"{verb} {summary[:30]}" in listed, verb


def test_import_lmdata_is_light_and_names_resolve():
    code = (
        "import sys, lmdata\n"
        "print('numpy' in sys.modules)\n"
        "import lmdata.tokenize.tokenizers\n"
        "print(callable(lmdata.tokenize), lmdata.open.__module__, lmdata.Loader.__name__)"
    )
    assert python_stdout(code).split() == ["False", "True", "lmdata._api", "Loader"]


def test_info_text_and_json():
    res = run("info", str(SPEC))
    assert res.exit_code == 0
    assert "format: flat-tokens" in res.output and "codecs: blosc" in res.output
    data = json.loads(run("info", "--json", str(SPEC)).output)
    assert data["splits"]["train"]["sequences"] == 3
    assert data["splits"]["validation"]["max_token_id"] == 9
    assert data["bytes_on_disk"] > 0


def test_cat_prints_json_lines():
    res = run("cat", str(SPEC), "--split", "validation")
    lines = [orjson.loads(x) for x in res.output.splitlines()]
    assert lines == [{"index": 0, "tokens": [5]}, {"index": 1, "tokens": [9, 9, 9, 9]}]
    res = run("cat", str(SPEC), "--limit", "1", "--offset", "1")
    assert [orjson.loads(x) for x in res.output.splitlines()] == [{"index": 1, "tokens": [3, 4, 5]}]


def test_validate_exit_status(tmp_path):
    assert run("validate", str(SPEC)).exit_code == 0
    p = tmp_path / "d.zarr"
    with Writer(p) as w:
        w.write([1, 2, 3])
    (p / "train" / ".zattrs").write_text('{"max_token_id": 1}')
    res = CliRunner().invoke(cli, ["validate", str(p)])
    assert res.exit_code == 1
    assert "greater than max_token_id 1" in res.output


def test_errors_are_one_line_not_tracebacks(tmp_path):
    (tmp_path / "x").mkdir()
    res = CliRunner().invoke(cli, ["info", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert res.output.startswith("error: ") and "Traceback" not in res.output
    assert "cannot tell the format" in res.output


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "lmdata.cli",
        "demo",
        "--out",
        str(tmp_path),
        "--limit",
        "40",
        "--steps",
        "3",
        "--workers",
        "1",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    table = out.stdout.split("valid\n", 1)[1].split("\n\n")[0].splitlines()
    assert len(table) == 10 and all(line.endswith(" ok") for line in table), out.stdout
    # every dataset but the flat-tokens train split holds all 40 documents
    assert all(" 40 " in line for line in table if ".flat-tokens" not in line), out.stdout


def test_cat_prints_integers_beyond_64_bits():
    mds = Path(__file__).parent.parent / "data" / "mds" / "all"
    res = CliRunner().invoke(cli, ["cat", str(mds)])
    assert res.exit_code == 0, res.output
    assert "10000000000000000000000000000" in res.output  # a str_int column holds 10**30


def test_unexpected_errors_are_one_line(tmp_path, monkeypatch):
    import lmdata.cli.info as info_mod

    def boom(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr(info_mod, "info", boom)
    monkeypatch.delenv("LMDATA_DEBUG", raising=False)
    res = CliRunner().invoke(cli, ["info", str(SPEC)])
    assert res.exit_code == 2
    assert "error: unexpected RuntimeError: kaput" in res.output and "Traceback" not in res.output
