"""Progress of ``lmdata validate``, ``info`` and ``merge``: plain lines on a non-terminal
stderr (one per report with LMDATA_PROGRESS_INTERVAL=0), nothing with --quiet, and stdout
left as scripts read it."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli import _progress
from lmdata.cli.main import cli

LINE = re.compile(r"^(validate|info|merge): [\d.]+ [kMG]?B of [\d.]+ [kMG]?B \((\d+)%\)")


def run(*args: str, interval: str | None = "0"):
    env = {"LMDATA_PROGRESS_INTERVAL": interval} if interval is not None else {}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


@pytest.fixture
def mds(tmp_path: Path) -> Path:
    """An MDS dataset of several shards."""
    path = tmp_path / "mds"
    with lmdata.writer(path, "mds", size_limit=300) as w:
        for i in range(40):
            w.write({"id": i, "text": "x" * i})
    assert len(json.loads((path / "index.json").read_text())["shards"]) >= 3
    return path


def _percents(stderr: str, verb: str) -> list[int]:
    """The percentages of ``verb``'s progress lines, checked: from 0 to 100, never backwards,
    then the closing line."""
    lines = stderr.splitlines()
    assert lines, "no progress on stderr"
    assert lines[-1].startswith(f"{verb}: done, "), lines
    found = [LINE.match(x) for x in lines[:-1]]
    assert len(found) >= 3 and all(m and m.group(1) == verb for m in found), lines
    pcts = [int(m.group(2)) for m in found if m]
    assert pcts == sorted(pcts) and pcts[0] == 0 and pcts[-1] == 100, lines
    return pcts


def test_validate_prints_progress_lines_to_stderr_and_nothing_when_quiet(mds: Path) -> None:
    res = run("validate", str(mds))
    assert res.exit_code == 0
    assert res.stdout == f"{mds}: valid mds dataset (names and sizes match its manifest)\n"
    _percents(res.stderr, "validate")
    quiet = run("validate", "--quiet", str(mds))
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_validate_problems_follow_the_progress_on_stderr(mds: Path) -> None:
    shard = sorted(mds.glob("shard.*.mds"))[1]
    shard.write_bytes(shard.read_bytes()[:-3])
    res = run("validate", str(mds))
    assert res.exit_code == 1
    err = res.stderr.splitlines()
    first = next(i for i, x in enumerate(err) if "problem(s)" in x)
    assert all(LINE.match(x) or x.startswith("validate: done") for x in err[:first]), err
    assert first >= 2 and shard.name in res.stderr


def test_info_json_stdout_is_unchanged_and_progress_goes_to_stderr(mds: Path) -> None:
    res = run("info", "--json", str(mds))
    assert res.exit_code == 0
    assert json.loads(res.stdout)["samples"] == 40
    assert res.stderr.splitlines()[-1].startswith("info: done, ")
    quiet = run("info", "--json", "-q", str(mds))
    assert json.loads(quiet.stdout) == json.loads(res.stdout) and quiet.stderr == ""
    # quick work under the default interval leaves stderr clean: output mixes nothing in
    default = run("info", "--json", str(mds), interval=None)
    assert default.stderr == "" and json.loads(default.output)["samples"] == 40


def test_info_scanning_a_jsonl_file_reports_as_it_scans(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("lmdata.formats.modalities_jsonl.index._PROGRESS_LINES", 8)
    path = tmp_path / "a.jsonl"
    path.write_text("".join(f'{{"n": {i}}}\n' for i in range(40)))
    res = run("info", str(path))
    assert res.exit_code == 0 and "documents: 40" in res.stdout
    _percents(res.stderr, "info")


def test_merge_prints_progress_and_its_summary(tmp_path: Path) -> None:
    paths = []
    for k in range(2):
        p = tmp_path / f"{k}.pbin"
        with lmdata.writer(p, "modalities") as w:
            for i in range(3):
                w.write(np.arange(1 + i + k, dtype=np.uint32))
        paths.append(str(p))
    out = tmp_path / "m.pbin"
    res = run("merge", *paths, "-o", str(out))
    assert res.exit_code == 0 and res.stdout.startswith("merged 2 modalities inputs: 6 records")
    lines = res.stderr.splitlines()
    assert lines[0].startswith("merge: 0 B of ") and lines[-1].startswith("merge: done, "), lines
    quiet = run("merge", *paths, "-o", str(out), "--overwrite", "-q")
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout.startswith("merged 2")


def test_failed_work_ends_without_a_done_line(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(_progress.sys, "stderr", out)
    monkeypatch.setenv("LMDATA_PROGRESS_INTERVAL", "0")
    with pytest.raises(KeyError), _progress.shown(leave=False) as progress:
        assert progress is not None
        progress(lmdata.Progress(0, 10, "bytes", "validate"))
        progress(lmdata.Progress(4, 10, "bytes", "validate"))
        raise KeyError
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("validate: 4 B of 10 B (40%)"), lines


def test_lines_that_do_not_leave_say_done_only_after_progress_lines() -> None:
    quick = io.StringIO()
    p = _progress.LogLines(total=10, unit="B", file=quick, interval=3600, leave=False)
    p.update(10)
    p.close()
    assert quick.getvalue() == ""  # work done before the first line leaves the log clean
    slow = io.StringIO()
    p = _progress.LogLines(total=10, unit="B", file=slow, interval=0, leave=False)
    p.update(4)
    p.update(6)
    p.close()
    lines = slow.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("done, 10 B in "), lines


def test_validate_of_one_large_dolma_file_reports_within_it(tmp_path: Path) -> None:
    docs = tmp_path / "tree" / "documents"
    docs.mkdir(parents=True)
    line = '{{"id": "{}", "text": "' + "w " * 400 + '", "source": "s"}}\n'
    (docs / "a.jsonl").write_text("".join(line.format(i) for i in range(3000)))  # 2.4 MB
    res = run("validate", str(tmp_path / "tree"))
    assert res.exit_code == 0, res.output
    assert any(0 < p < 100 for p in _percents(res.stderr, "validate"))  # one file, read in MiBs
