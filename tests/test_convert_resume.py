"""convert --resume: an interrupted job keeps its staged blocks, a resumed one reads only the
rest, and the output is byte for byte an uninterrupted run's."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.cli.main import cli
from lmdata.convert import convert
from lmdata.errors import InvalidInputError

conv = importlib.import_module("lmdata.convert")  # the module, not lmdata.convert

BLOCK = 16  # records per block in these tests: a few hundred records make many blocks


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(conv, "BLOCK", BLOCK)


def tokens_source(path: Path, n: int = 200) -> Path:
    rng = np.random.default_rng(7)
    with lmdata.writer(path, "flat-tokens") as w:
        for i in range(n):
            w.write(
                rng.integers(0, 60_000, int(rng.integers(1, 30))),
                split="validation" if i % 9 == 0 else "train",
            )
    return path


def records_source(path: Path, n: int = 150) -> Path:
    cols = {"id": "str", "text": "str", "n": "int"}
    with lmdata.writer(path, "mds", columns=cols) as w:
        for i in range(n):
            w.write({"id": f"d{i}", "text": "é🙂 " * (i % 13), "n": i})
    return path


def tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (or ``root`` itself) by its relative name."""
    if root.is_file():
        return {"": root.read_bytes()}
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


class Stop(KeyboardInterrupt):
    """Ctrl-C after some blocks were written."""


def stop_after(blocks: int):
    """A progress callback (called once per block written) that presses Ctrl-C once
    ``blocks`` blocks are written."""
    calls = []

    def progress(e) -> None:
        if not e.done:  # the first event announces the total
            return
        calls.append(e.done)
        if len(calls) == blocks:
            raise Stop

    return progress


def read_units(monkeypatch) -> list[int]:
    """The first record of every block the executor is asked to read, in order."""
    seen: list[int] = []
    real = conv.executor_for

    class Recording:
        def __init__(self, inner):
            self.inner, self.workers, self.in_process = inner, inner.workers, inner.in_process

        def map_ordered(self, fn, units, **kw):
            units = list(units)
            seen.extend(u.lo for u in units)
            return self.inner.map_ordered(fn, units, **kw)

    monkeypatch.setattr(conv, "executor_for", lambda *a, **k: Recording(real(*a, **k)))
    return seen


def test_tokens_resume_with_workers_reads_only_the_blocks_not_done(tmp_path, monkeypatch):
    src = tokens_source(tmp_path / "src.zarr")
    convert(src, tmp_path / "ref" / "out", "mds", split="train", workers=0)
    out, work = tmp_path / "run" / "out", tmp_path / "run" / ".out.lmdata-convert"
    with pytest.raises(Stop):
        convert(src, out, "mds", split="train", workers=2, progress=stop_after(4))
    assert not out.exists() and work.is_dir()  # no output; the staging area kept
    assert (work / "done.log").read_text().split() == [f"000000-{k:06d}" for k in range(4)]
    seen = read_units(monkeypatch)
    s = convert(src, out, "mds", split="train", workers=2, resume=True)
    assert seen == list(range(4 * BLOCK, s.records, BLOCK))  # blocks 0-3 not read again
    assert s.resumed == 4 * BLOCK and "from the interrupted job" in s.line()
    assert tree(out) == tree(tmp_path / "ref" / "out") != {}
    assert not work.exists()


def test_flat_tokens_both_splits_resume_into_flat_tokens(tmp_path, monkeypatch):
    src = tokens_source(tmp_path / "src.zarr")
    convert(src, tmp_path / "ref.zarr", "flat-tokens", workers=0)
    n_train = len(lmdata.open(src, split="train"))
    blocks_train = -(-n_train // BLOCK)
    with pytest.raises(Stop):  # interrupted in the validation split, after all of train
        stop = stop_after(blocks_train + 1)
        convert(src, tmp_path / "o.zarr", "flat-tokens", workers=2, progress=stop)
    seen = read_units(monkeypatch)
    s = convert(src, tmp_path / "o.zarr", "flat-tokens", workers=2, resume=True)
    assert seen == [BLOCK]  # the validation split's second block only (23 records)
    assert s.records == 200 and s.resumed == 200 - 7
    assert tree(tmp_path / "o.zarr") == tree(tmp_path / "ref.zarr")


def test_records_resume_in_process_reads_no_finished_block_again(tmp_path, monkeypatch):
    src = records_source(tmp_path / "src.mds")
    convert(src, tmp_path / "ref.jsonl", "jsonl", workers=0)
    calls: list[int] = []
    real = conv._read_block

    def failing(block):  # the disk fills while the fourth block is read
        calls.append(block.lo)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        return real(block)

    monkeypatch.setattr(conv, "_read_block", failing)
    with pytest.raises(OSError):  # in this process, staged because of resume=True
        convert(src, tmp_path / "o.jsonl", "jsonl", workers=0, resume=True)
    assert not (tmp_path / "o.jsonl").exists()
    assert (tmp_path / ".o.jsonl.lmdata-convert" / "done.log").read_text().count("\n") == 3
    calls.clear()
    monkeypatch.setattr(conv, "_read_block", lambda b: calls.append(b.lo) or real(b))
    s = convert(src, tmp_path / "o.jsonl", "jsonl", workers=0, resume=True)
    assert calls == list(range(3 * BLOCK, 150, BLOCK)) and s.resumed == 3 * BLOCK
    assert (tmp_path / "o.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


# the autouse fixture only sets BLOCK, which each example sets itself
def test_a_resumed_job_interrupted_again_resumes_from_both_runs(tmp_path, monkeypatch):
    src = records_source(tmp_path / "src.mds")
    convert(src, tmp_path / "ref.jsonl", "jsonl", workers=0)
    with pytest.raises(Stop):
        convert(src, tmp_path / "o.jsonl", "jsonl", workers=2, progress=stop_after(2))
    with pytest.raises(Stop):  # 2 blocks replayed, 3 read, then Ctrl-C again
        convert(src, tmp_path / "o.jsonl", "jsonl", workers=2, resume=True, progress=stop_after(5))
    seen = read_units(monkeypatch)
    s = convert(src, tmp_path / "o.jsonl", "jsonl", workers=2, resume=True)
    assert seen == list(range(5 * BLOCK, 150, BLOCK)) and s.resumed == 5 * BLOCK
    assert (tmp_path / "o.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stop=st.integers(1, 12), block=st.sampled_from([7, 16, 64]))
def test_any_interruption_point_resumes_to_the_same_bytes(stop, block):
    stop = min(stop, -(-70 // block))  # after the last block: interrupted before the commit
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src = records_source(tmp / "src.mds", n=70)
        old = conv.BLOCK
        conv.BLOCK = block
        try:
            convert(src, tmp / "r" / "o", "mds-jsonl", workers=0)
            with pytest.raises(Stop):
                convert(
                    src, tmp / "o", "mds-jsonl", workers=0, resume=True, progress=stop_after(stop)
                )
            s = convert(src, tmp / "o", "mds-jsonl", workers=0, resume=True)
        finally:
            conv.BLOCK = old
        assert s.records == 70 and s.resumed == min(stop * block, 70)
        assert tree(tmp / "o") == tree(tmp / "r" / "o")


def test_a_changed_source_or_option_refuses_resume(tmp_path):
    src = records_source(tmp_path / "src.mds")
    with pytest.raises(Stop):
        convert(src, tmp_path / "o", "mds", workers=2, progress=stop_after(2))
    with pytest.raises(
        InvalidInputError, match=r"cannot resume: job\.writer_options\.compression differs from"
    ):
        convert(
            src,
            tmp_path / "o",
            "mds",
            workers=2,
            resume=True,
            writer_options={"compression": "zstd"},
        )
    with pytest.raises(InvalidInputError, match=r"job\.to differs"):
        convert(src, tmp_path / "o", "jsonl", workers=2, resume=True)
    shard = next(src.glob("shard.*.mds"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    with pytest.raises(InvalidInputError, match=r"source\.digest differs.*without --resume"):
        convert(src, tmp_path / "o", "mds", workers=2, resume=True)
    assert (tmp_path / ".o.lmdata-convert" / "manifest.json").exists()  # refused: untouched
    convert(src, tmp_path / "o", "mds", workers=2)  # a new job (no --resume) starts over
    assert len(lmdata.open(tmp_path / "o")) == 150


def test_an_error_in_the_data_removes_the_staging_area(tmp_path):
    with lmdata.writer(tmp_path / "src.jsonl", "jsonl") as w:
        for i in range(100):
            w.write({"id": str(i), "text": "x"} if i != 60 else {"id": str(i), "text": {"a": 1}})
    with pytest.raises(InvalidInputError, match="record 60"):  # mds cannot hold a dict text
        convert(tmp_path / "src.jsonl", tmp_path / "m", "mds", workers=2)
    assert not (tmp_path / ".m.lmdata-convert").exists()  # a resume would stop there again
    assert not (tmp_path / "m").exists()


def test_resume_without_an_interrupted_job_is_a_plain_run(tmp_path):
    src = tokens_source(tmp_path / "src.zarr")
    convert(src, tmp_path / "ref.pbin", "modalities", split="validation", workers=0)
    s = convert(src, tmp_path / "o.pbin", "modalities", split="validation", workers=2, resume=True)
    assert s.resumed == 0 and "interrupted" not in s.line()
    assert (tmp_path / "o.pbin").read_bytes() == (tmp_path / "ref.pbin").read_bytes()
    assert not (tmp_path / ".o.pbin.lmdata-convert").exists()


def test_a_killed_convert_resumes(tmp_path):
    """SIGKILL of the whole job after three blocks: no output, and the blocks done are kept."""
    src = records_source(tmp_path / "src.mds")
    convert(src, tmp_path / "ref" / "out", "dolma", workers=0)
    code = (
        "import os, signal, sys\n"
        "import importlib\nconv = importlib.import_module('lmdata.convert')\n"
        f"conv.BLOCK = {BLOCK}\n"
        "def progress(e):\n"
        f"    if e.done >= 3 * {BLOCK}:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "conv.convert(sys.argv[1], sys.argv[2], 'dolma', workers=0, resume=True,\n"
        "             progress=progress)\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "out")], check=False)
    assert res.returncode == -signal.SIGKILL
    assert not (tmp_path / "out").exists()
    s = convert(src, tmp_path / "out", "dolma", workers=0, resume=True)
    assert s.resumed == 3 * BLOCK
    assert tree(tmp_path / "out") == tree(tmp_path / "ref" / "out")


def test_cli_resume(tmp_path, monkeypatch):
    src = records_source(tmp_path / "src.mds")
    convert(src, tmp_path / "ref.jsonl", "jsonl", workers=0)
    real = conv._read_block
    calls: list[int] = []

    def interrupted(block):
        calls.append(block.lo)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(block)

    monkeypatch.setattr(conv, "_read_block", interrupted)
    args = ["convert", str(src), str(tmp_path / "o.jsonl"), "--to", "jsonl", "--workers", "0", "-q"]
    res = CliRunner().invoke(cli, [*args, "--resume"])
    assert res.exit_code == 130
    assert "interrupted: no output written; `--resume` continues from" in res.stderr
    assert ".o.jsonl.lmdata-convert" in res.stderr
    monkeypatch.setattr(conv, "_read_block", real)
    res = CliRunner().invoke(cli, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    assert "32 of them from the interrupted job" in res.stdout
    assert (tmp_path / "o.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def test_cli_error_that_a_resume_survives_says_where_to_resume(tmp_path, monkeypatch):
    from lmdata.errors import DatasetNotFoundError

    src = records_source(tmp_path / "src.mds")
    real = conv._read_block
    calls: list[int] = []

    def vanished(block):  # a piece of the source went missing on its store for a moment
        calls.append(block.lo)
        if len(calls) == 3:
            raise DatasetNotFoundError("gone", path="shard")
        return real(block)

    monkeypatch.setattr(conv, "_read_block", vanished)
    args = ["convert", str(src), str(tmp_path / "o"), "--to", "mds", "--workers", "0", "--resume"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    assert res.stderr.splitlines()[0] == "error: shard: gone"
    assert "no output written; `--resume` continues from" in res.stderr.splitlines()[1]
    assert (tmp_path / ".o.lmdata-convert" / "done.log").read_text().count("\n") == 2


def test_cli_a_refused_resume_offers_no_resume(tmp_path):
    # The interrupted job's staging area stays when --resume is refused (the options changed):
    # the CLI must not add "`--resume` continues from" under "run again without --resume".
    src = records_source(tmp_path / "src.mds")
    with pytest.raises(Stop):
        convert(src, tmp_path / "o", "mds", workers=2, progress=stop_after(2))
    args = ["convert", str(src), str(tmp_path / "o"), "--to", "jsonl", "--resume", "-q"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "job.to differs" in res.stderr
    assert (tmp_path / ".o.lmdata-convert" / "manifest.json").exists()
    assert "`--resume` continues from" not in res.stderr


def test_cli_help_documents_resume():
    res = CliRunner().invoke(cli, ["convert", "--help"])
    assert "--resume" in res.output and "not read again" in res.output


def test_resume_on_every_store(where):
    """Source and output local, on memory:// or on S3 (moto): the staging area beside the
    output (on S3: `done/` markers), the source's version from the store's listing."""
    from lmdata.convert import work_area
    from lmdata.storage import resolve

    src = records_source(where, n=60)  # type: ignore[arg-type]
    store, key = resolve(where)
    store.remove(f"{key}/lmdata-manifest")  # the resume's own check is tested (not the manifest's)
    out = f"{where}-out"
    with pytest.raises(Stop):
        convert(src, out, "mds-jsonl", workers=0, resume=True, progress=stop_after(2))
    assert work_area(out).done() == {(0, 0), (0, 1)}
    store.put(f"{key}/NOTES.txt", b"a file more")  # the source changed: a file more
    with pytest.raises(InvalidInputError, match=r"source\.(digest|files|size)"):
        convert(src, out, "mds-jsonl", workers=0, resume=True)
    store.remove(f"{key}/NOTES.txt")
    s = convert(src, out, "mds-jsonl", workers=0, resume=True)
    assert s.resumed == 2 * BLOCK and not work_area(out).exists()
    assert [r["n"] for r in lmdata.open(out)] == list(range(60))
