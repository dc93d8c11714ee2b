"""The documents -> tokens pipeline: determinism, no silent loss, resume, bad input."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.tokenize import ByteTokenizer
from lmdata.tokenize.pipeline import TokenizeJob, tokenize, work_dir_for
from lmdata.tokenize.pipeline import _process as pipeline_process
from lmdata.tokenize.sources import (
    RANGE_BYTES,
    TAIL_RANGES,
    TAIL_SMALLEST,
    InputFile,
    first_line,
    plan_units,
    read_batches,
)
from tests._manifests import restate

TRAPS = [
    "",
    " ",
    "\n\n",
    "a\u2028b",
    "x\x85y",
    "\ufeffbom",
    "emoji 🙂 mixed é",
    "\x00nul",
    "tab\tsep",
    '"quoted"',
    "<|endoftext|>",
]


def interrupt_at(n: int):
    """A progress callback that raises KeyboardInterrupt (a Ctrl-C) at its ``n``-th count of
    documents (one per part committed)."""
    calls = {"n": 0}

    def progress(e):
        if e.unit != "documents":
            return
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt

    return progress


def documents(seen: list[int]):
    """A progress callback that keeps the running count of documents tokenized."""
    return lambda e: seen.append(e.done) if e.unit == "documents" else None


def tree_bytes(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    docs = [
        {"id": f"d{i}", "text": TRAPS[i % len(TRAPS)] + " word" * int(rng.integers(0, 60))}
        for i in range(1200)
    ]
    with open(d / "a.jsonl", "w") as f:
        for doc in docs[:500]:
            f.write(json.dumps(doc) + "\n")
    with gzip.open(d / "b.jsonl.gz", "wt") as f:
        for doc in docs[500:1000]:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    import zstandard

    (d / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(
            "".join(json.dumps(x) + "\n" for x in docs[1000:]).encode()
        )
    )
    return d


def all_texts(corpus: Path) -> list[str]:
    out = []
    for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst"):
        f = corpus / name
        if name.endswith(".gz"):
            lines = gzip.open(f, "rt").read().split("\n")[:-1]  # not splitlines: U+2028
        elif name.endswith(".zst"):
            import zstandard

            lines = zstandard.ZstdDecompressor().decompress(f.read_bytes()).decode().split("\n")
            lines = [x for x in lines if x]
        else:
            lines = f.read_text().split("\n")[:-1]
        out += [json.loads(x)["text"] for x in lines]
    return out


def run(corpus: Path, dst: Path, workers: int, **kw) -> lmdata.tokenize.pipeline.Summary:
    range_bytes = kw.pop("range_bytes", RANGE_BYTES)
    job = TokenizeJob(
        to="flat-tokens",
        batch_docs=kw.pop("batch_docs", 64),
        validation_fraction=kw.pop("validation_fraction", 0.1),
        **kw,
    )
    return tokenize([corpus], dst, job, workers=workers, range_bytes=range_bytes)


def test_tokens_are_exact_and_nothing_is_lost(corpus, tmp_path):
    s = run(corpus, tmp_path / "out", workers=0)
    texts = all_texts(corpus)
    assert s.documents_read == s.documents_written == len(texts) == 1200
    assert s.documents_skipped == 0
    tok = ByteTokenizer()
    train = lmdata.open(tmp_path / "out")
    val = lmdata.open(tmp_path / "out", split="validation")
    assert len(train) + len(val) == 1200
    assert 50 < len(val) < 200
    got = sorted(tok.decode(x) for x in list(train) + list(val))
    assert got == sorted(texts)  # every document, empty and unicode traps included, exactly
    assert lmdata.validate(tmp_path / "out") == []
    assert not work_dir_for(tmp_path / "out").exists()


def test_identical_bytes_for_any_number_of_workers(corpus, tmp_path):
    outs = []
    for w in (0, 1, 2, 4):
        run(corpus, tmp_path / f"w{w}", workers=w)
        outs.append(tree_bytes(tmp_path / f"w{w}"))
    # a.jsonl (plain, ~17 kB) cut into byte ranges, on two worker processes
    run(corpus, tmp_path / "ranges", workers=2, range_bytes=3000)
    outs.append(tree_bytes(tmp_path / "ranges"))
    assert all(o == outs[0] for o in outs[1:])


def test_malformed_lines_are_errors_or_counted_skips(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "ok"}\n{broken\n{"id": 3}\n{"text": 5}\n[1]\n{"text": "fine"}\n')
    with pytest.raises(InvalidInputError, match=r"bad.jsonl: line 2: malformed JSON"):
        run(src, tmp_path / "o1", workers=0)
    assert not (tmp_path / "o1").exists() and not work_dir_for(tmp_path / "o1").exists()
    s = run(src, tmp_path / "o2", workers=0, skip_invalid=True, validation_fraction=0.0)
    assert (s.documents_read, s.documents_written, s.documents_skipped) == (6, 2, 4)
    assert [m.split(": ", 1)[1][:7] for m in s.skipped] == [
        "line 2:",
        "line 3:",
        "line 4:",
        "line 5:",
    ]
    assert [ByteTokenizer().decode(x) for x in lmdata.open(tmp_path / "o2")] == ["ok", "fine"]


def test_error_in_worker_process_names_file_and_line(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "ok"}\n' * 10 + '{"txt": "no"}\n')
    with pytest.raises(InvalidInputError, match=r"line 11: no 'text' field"):
        run(src, tmp_path / "o", workers=2, batch_docs=4)
    for range_bytes in (1, 7, 16, 40):  # the bad line in a byte range: still its file line
        with pytest.raises(InvalidInputError, match=r"line 11: no 'text' field"):
            run(src, tmp_path / "o", workers=0, batch_docs=4, range_bytes=range_bytes)


def test_text_key_parquet_and_text_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["alpha", "", "gamma"]}), tmp_path / "p.parquet")
    (tmp_path / "t.txt").write_text("whole file is one document\n")
    job = TokenizeJob(to="flat-tokens", text_key="body")
    s = tokenize([tmp_path / "p.parquet", tmp_path / "t.txt"], tmp_path / "o", job, workers=0)
    assert s.documents_written == 4
    tok = ByteTokenizer()
    assert [tok.decode(x) for x in lmdata.open(tmp_path / "o")] == [
        "alpha",
        "",
        "gamma",
        "whole file is one document\n",
    ]


def test_huge_document(tmp_path):
    big = "x" * (30 << 20)
    (tmp_path / "big.jsonl").write_text(json.dumps({"text": big}) + "\n")
    s = run(tmp_path / "big.jsonl", tmp_path / "o", workers=1, validation_fraction=0.0)
    r = lmdata.open(tmp_path / "o")
    assert s.tokens == len(big) and r[0].shape == (len(big),) and (r[0] == ord("x") + 1).all()


def test_refuses_to_overwrite(corpus, tmp_path):
    (tmp_path / "o").mkdir()
    with pytest.raises(OutputExistsError):
        run(corpus, tmp_path / "o", workers=0)


def test_resume_after_interrupt_gives_the_same_bytes(corpus, tmp_path):
    run(corpus, tmp_path / "ref", workers=0)
    job = TokenizeJob(to="flat-tokens", batch_docs=64, validation_fraction=0.1)
    stop_midway = interrupt_at(12)  # inside the second input file
    with pytest.raises(KeyboardInterrupt):
        tokenize([corpus], tmp_path / "out", job, workers=0, progress=stop_midway)
    assert not (tmp_path / "out").exists()
    work = work_dir_for(tmp_path / "out")
    assert (work / "done.log").read_text() == "000000-000000\n"  # file 0, unit 0
    seen = []
    tokenize(
        [corpus],
        tmp_path / "out",
        job,
        workers=0,
        resume=True,
        progress=documents(seen),
    )
    assert seen[-1] == 700  # only the two unfinished files were tokenized again
    assert "lmdata-manifest" in tree_bytes(tmp_path / "ref")  # and the resumed job's the same
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


def test_resume_after_sigkill_at_a_random_point(corpus, tmp_path):
    run(corpus, tmp_path / "ref", workers=0)
    code = (
        "import sys; from lmdata.tokenize.pipeline import TokenizeJob, tokenize\n"
        "import time\n"
        "job = TokenizeJob(to='flat-tokens', batch_docs=64, validation_fraction=0.1)\n"
        "tokenize([sys.argv[1]], sys.argv[2], job, workers=0,"
        " progress=lambda e: time.sleep(0.02) if e.unit == 'documents' else None)\n"
    )
    delay = float(np.random.default_rng().uniform(0.6, 1.4))
    p = subprocess.Popen([sys.executable, "-c", code, str(corpus), str(tmp_path / "out")])
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    job = TokenizeJob(to="flat-tokens", batch_docs=64, validation_fraction=0.1)
    if not (tmp_path / "out").exists():
        tokenize(
            [corpus],
            tmp_path / "out",
            job,
            workers=0,
            resume=work_dir_for(tmp_path / "out").exists(),
        )
    # the child may finish before the kill: its recorded command line is its own
    assert _without_command(tmp_path / "out") == _without_command(tmp_path / "ref")


def _without_command(p: Path) -> dict[str, bytes]:
    """tree_bytes with the provenance command line (which names the process) blanked."""
    from lmdata import _provenance as provenance

    original = tree_bytes(p)
    assert "lmdata-manifest" in original
    meta = json.loads(original[".zattrs"])
    meta[provenance.KEY]["command"] = ""
    out = {**original, ".zattrs": json.dumps(meta, sort_keys=True).encode()}
    return restate(out, original)  # the manifest as it would be for that .zattrs


def test_resume_refuses_changed_options(corpus, tmp_path):
    job = TokenizeJob(to="flat-tokens", batch_docs=64)

    def stop(stats):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize([corpus], tmp_path / "out", job, workers=0, progress=stop)
    with pytest.raises(InvalidInputError, match="cannot resume"):
        tokenize(
            [corpus],
            tmp_path / "out",
            TokenizeJob(to="flat-tokens", batch_docs=32),
            workers=0,
            resume=True,
        )


def test_cli_tokenize_prints_counts(corpus, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmdata",
            "tokenize",
            str(corpus),
            str(tmp_path / "o"),
            "--to",
            "flat-tokens",
            "--workers",
            "1",
            "-q",
        ],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert out.returncode == 0, out.stderr
    assert "documents read 1,200, written 1,200, skipped 0" in out.stdout


def test_missing_tokenizer_file_is_clear(tmp_path, corpus):
    with pytest.raises(InvalidInputError, match="never downloads"):
        run(corpus, tmp_path / "o", workers=0, tokenizer=str(tmp_path / "nope.json"))


MOD = Path(__file__).parents[1] / "data" / "modalities"


@pytest.mark.parametrize("workers", [0, 2])
def test_tokenize_to_modalities_is_byte_identical_to_the_origin(tmp_path, workers):
    """The reference .pbin was written by modalities 0.5.0's pack_encoded_data."""
    job = TokenizeJob(
        to="modalities",
        tokenizer=str(MOD / "tokenizers/bpe5k/tokenizer.json"),
        eod="<|endoftext|>",
        batch_docs=37,
    )
    s = tokenize([MOD / "docs.jsonl"], tmp_path / "out.pbin", job, workers=workers)
    assert s.documents_read == s.documents_written == 300
    assert (tmp_path / "out.pbin").read_bytes() == (MOD / "docs_bpe5k.pbin").read_bytes()


def test_modalities_needs_an_eod_token(tmp_path, corpus):
    with pytest.raises(InvalidInputError, match="--eod"):
        tokenize([corpus], tmp_path / "o.pbin", TokenizeJob(to="modalities"), workers=0)


@pytest.mark.parametrize("fmt", ["atlas", "mds", "dolma"])
def test_record_datasets_and_dolma_trees_as_sources(tmp_path, fmt):
    docs = [{"id": str(i), "text": t, "source": "s"} for i, t in enumerate(["ab", "", "çd"])]
    opts = {"columns": {"id": "str", "text": "str", "source": "str"}} if fmt == "mds" else {}
    with lmdata.writer(tmp_path / "src", fmt, **opts) as w:
        for d in docs:
            w.write(d)
    s = tokenize([tmp_path / "src"], tmp_path / "o", TokenizeJob(to="flat-tokens"), workers=0)
    assert s.documents_written == 3
    tok = ByteTokenizer()
    assert [tok.decode(x) for x in lmdata.open(tmp_path / "o")] == ["ab", "", "çd"]


def test_record_without_text_field_is_reported(tmp_path):
    with lmdata.writer(tmp_path / "src", "atlas") as w:
        w.write({"text": "fine"})
        w.write({"body": "no text"})
    with pytest.raises(InvalidInputError, match="record 2: no 'text' field"):
        tokenize([tmp_path / "src"], tmp_path / "o", TokenizeJob(to="flat-tokens"), workers=0)
    s = tokenize(
        [tmp_path / "src"],
        tmp_path / "o",
        TokenizeJob(to="flat-tokens", skip_invalid=True),
        workers=0,
    )
    assert (s.documents_read, s.documents_skipped) == (2, 1)


def test_options_that_cannot_apply_are_errors(corpus, tmp_path):
    with pytest.raises(InvalidInputError, match="no validation split"):
        tokenize(
            [corpus],
            tmp_path / "o.pbin",
            TokenizeJob(to="modalities", eod_id=0),
            validation_sources=[corpus],
            workers=0,
        )
    with pytest.raises(InvalidInputError, match="once"):
        tokenize(
            [corpus],
            tmp_path / "o.pbin",
            TokenizeJob(to="modalities", eod="x", eod_id=1),
            workers=0,
        )
    with pytest.raises(InvalidInputError, match="no splits"):
        lmdata.open(MOD / "docs_bpe5k.pbin", split="validation")


def test_naming_an_eod_appends_it(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "ab"}\n')
    tokenize(
        [tmp_path / "d.jsonl"], tmp_path / "o", TokenizeJob(to="flat-tokens", eod_id=0), workers=0
    )
    assert lmdata.open(tmp_path / "o")[0].tolist() == [98, 99, 0]


def test_ctrl_c_stops_workers_and_leaves_nothing(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": "word " * 400}) + "\n" for _ in range(20000)))
    started = tmp_path / "started"
    # the job is under way (its first progress report) when Ctrl-C comes, and slow enough
    # (0.5 s per report, 16 or more units) that it cannot finish first on a fast machine
    code = (
        "import pathlib, signal, sys, time\n"
        "from lmdata.tokenize.pipeline import TokenizeJob, tokenize\n"
        # as at a terminal, even when the suite runs in the background (where the shell starts
        # it, and so this child, with Ctrl-C ignored)
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "def progress(e):\n"
        "    if e.unit == 'documents': pathlib.Path(sys.argv[3]).touch(); time.sleep(0.5)\n"
        "tokenize([sys.argv[1]], sys.argv[2], TokenizeJob(to='flat-tokens', batch_docs=8),"
        " workers=2, progress=progress)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(src), str(tmp_path / "out"), str(started)],
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300  # (a few seconds: only a failure waits it out)
    while not started.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), p.stderr.read().decode()[-2000:]
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("tokenize did not stop after Ctrl-C")
    assert p.returncode != 0
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".lmdata-tmp-*"))


def test_in_process_job_leaves_the_callers_environment_alone(corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    run(corpus, tmp_path / "o", workers=0)
    assert "RAYON_NUM_THREADS" not in os.environ
    assert "TOKENIZERS_PARALLELISM" not in os.environ


def _lines_of(data: bytes) -> list[bytes]:
    """The lines of ``data`` as JSONL readers see them: split at b"\\n" only."""
    parts = data.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


@settings(max_examples=80, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=25),
    trailing_newline=st.booleans(),
    range_bytes=st.integers(1, 70),
    batch=st.integers(1, 4),
)
def test_byte_ranges_hold_every_line_exactly_once(lines, trailing_newline, range_bytes, batch):
    import tempfile

    data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "a.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        units = plan_units([InputFile(path, "jsonl", len(data))], range_bytes)
        assert all(u.splittable for u in units)
        got: list[bytes] = []
        for u in units:
            items = [x for b in read_batches(u, batch) for x in b.items]
            offset = sum(map(len, got))
            for line in items:  # a range holds the lines that start in it
                assert u.start <= offset < u.end
                offset += len(line)
            if items:
                assert first_line(u) == len(got) + 1  # error messages name the file's line
            got += items
    assert got == _lines_of(data)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=3),
    range_bytes=st.integers(1, 900),
)
def test_the_jobs_last_ranges_are_cut_smaller_so_workers_finish_together(sizes, range_bytes):
    """Byte ranges cover each file once, in order; the last file's last TAIL_RANGES ranges are
    cut again into halves of what is left, down to the last two pieces (about a TAIL_SMALLEST-th
    of a range each); the other files and a file of one range keep whole ranges. The plan
    depends only on the inputs and the range size (no worker count goes in)."""
    inputs = [InputFile(f"f{i}.jsonl", "jsonl", n) for i, n in enumerate(sizes)]
    units = plan_units(inputs, range_bytes)
    assert units == plan_units(inputs, range_bytes)
    for fi, size in enumerate(sizes):
        mine = [u for u in units if u.file_index == fi]
        assert [u.part for u in mine] == list(range(len(mine)))
        assert mine[0].start == 0 and mine[-1].end == size
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert all(u.start < u.end for u in mine) or size == 0
        assert all(u.end - u.start <= range_bytes for u in mine)
        whole = -(-size // range_bytes) if size else 1
        if fi < len(sizes) - 1 or whole < 2:
            assert len(mine) == whole  # untouched
            continue
        tail = mine[max(0, whole - TAIL_RANGES) :]
        lengths = [u.end - u.start for u in tail]
        assert tail[0].start == range_bytes * max(0, whole - TAIL_RANGES)
        assert lengths[:-1] == sorted(lengths[:-1], reverse=True)  # shrinking pieces
        assert abs(lengths[-1] - lengths[-2]) <= 1  # the last two: equal
        assert lengths[-1] <= max(1, range_bytes // TAIL_SMALLEST)
        assert len(tail) > min(TAIL_RANGES, whole) or sum(lengths) < 2 * TAIL_SMALLEST


def test_a_resume_refuses_a_work_folder_planned_with_another_tail(corpus, tmp_path):
    job = TokenizeJob(to="flat-tokens", batch_docs=64)
    with pytest.raises(KeyboardInterrupt):
        tokenize(
            [corpus], tmp_path / "o", job, workers=0, progress=interrupt_at(3), range_bytes=3000
        )
    manifest = work_dir_for(tmp_path / "o") / "manifest.json"
    old = json.loads(manifest.read_bytes())
    assert old["plan"]["tail"] == [TAIL_RANGES, TAIL_SMALLEST]
    del old["plan"]["tail"]  # as an lmdata that cut no tail wrote it
    manifest.write_bytes(json.dumps(old, sort_keys=True, separators=(",", ":")).encode())
    with pytest.raises(InvalidInputError, match=r"plan\.tail differs"):
        tokenize([corpus], tmp_path / "o", job, workers=0, resume=True, range_bytes=3000)


@pytest.fixture(scope="module")
def ragged(tmp_path_factory) -> Path:
    """Documents without ids (their split follows their line number), bad and blank lines, a
    last line without a newline."""
    rng = np.random.default_rng(1)
    lines = [
        json.dumps({"text": TRAPS[i % len(TRAPS)] * int(rng.integers(1, 9))}) for i in range(40)
    ]
    lines[7], lines[19], lines[30] = "{broken", "", '{"id": 3}'
    path = tmp_path_factory.mktemp("ragged") / "r.jsonl"
    path.write_text("\n".join(lines))
    return path


def _ragged_run(src: Path, dst: Path, range_bytes: int) -> tuple[dict[str, bytes], list[str]]:
    job = TokenizeJob(to="flat-tokens", batch_docs=3, validation_fraction=0.3, skip_invalid=True)
    s = tokenize([src], dst, job, workers=0, range_bytes=range_bytes)
    assert (s.documents_read, s.documents_skipped) == (40, 3)
    return tree_bytes(dst), s.skipped


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(range_bytes=st.integers(1, 2000))
def test_identical_bytes_for_any_range_size(ragged, tmp_path, range_bytes):
    ref = tmp_path / "ref"
    if not ref.exists():
        ref_out = _ragged_run(ragged, ref, RANGE_BYTES)  # the whole file is one unit
        (tmp_path / "ref.json").write_text(json.dumps(ref_out[1]))
    dst = tmp_path / f"r{range_bytes}"
    shutil.rmtree(dst, ignore_errors=True)
    tree, skipped = _ragged_run(ragged, dst, range_bytes)
    assert tree == tree_bytes(ref)
    assert skipped == json.loads((tmp_path / "ref.json").read_text())  # same line numbers
    assert any("line 8:" in m for m in skipped)


def test_resume_skips_the_byte_ranges_already_done(corpus, tmp_path):
    run(corpus, tmp_path / "ref", workers=0)  # one unit per file
    job = TokenizeJob(to="flat-tokens", batch_docs=64, validation_fraction=0.1)
    stop_midway = interrupt_at(5)  # in the third byte range of a.jsonl
    with pytest.raises(KeyboardInterrupt):
        tokenize([corpus], tmp_path / "out", job, workers=0, progress=stop_midway, range_bytes=3000)
    work = work_dir_for(tmp_path / "out")
    a = corpus / "a.jsonl"
    a_units = plan_units([InputFile(str(a), "jsonl", a.stat().st_size)], 3000)
    done = (work / "done.log").read_text().split()
    assert 2 <= len(done) < len(a_units)  # the first ranges of a.jsonl, in order
    assert done == [f"000000-{i:06d}" for i in range(len(done))]
    with open(work / "done.log", "a") as f:
        f.write(f"000000-{len(done):06d}")  # a kill while marking the next unit: not done
    skipped = sum(len(b.items) for u in a_units[: len(done)] for b in read_batches(u, 64))
    seen = []
    tokenize(
        [corpus],
        tmp_path / "out",
        job,
        workers=0,
        resume=True,
        progress=documents(seen),
        range_bytes=3000,
    )
    assert seen[-1] == 1200 - skipped
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


def test_workers_stage_tokens_themselves_and_hand_back_only_names(corpus, tmp_path):
    import pickle

    from lmdata import parallel

    sent: list[int] = []  # pickled bytes of each task and result crossing the executor

    class Recording:
        """An executor of the caller's (executor=): the local processes', recording sizes."""

        def __init__(self, inner):
            self.inner, self.workers, self.in_process = inner, inner.workers, inner.in_process

        def map_ordered(self, fn, units, **kw):
            def tasks():
                for u in units:
                    sent.append(len(pickle.dumps(u)))
                    yield u

            for r in self.inner.map_ordered(fn, tasks(), **kw):
                sent.append(len(pickle.dumps(r)))
                yield r

    work = work_dir_for(tmp_path / "o")
    staged: list[int] = []
    job = TokenizeJob(to="flat-tokens", batch_docs=64)
    progress = lambda e: staged.append(len(list((work / "parts").glob("*.tok"))))  # noqa: E731
    ex = Recording(parallel.LocalProcesses(2))
    s = tokenize([corpus], tmp_path / "o", job, executor=ex, range_bytes=3000, progress=progress)
    assert len(sent) > 2 * 5 and max(sent) < 1024  # names and counts, never documents or tokens
    assert s.tokens > 50 * max(sent)
    assert max(staged) > 0  # the parts were staged in the work folder ...
    assert not work.exists()  # ... and removed once committed


def test_parts_staged_on_an_object_store_resume_and_are_removed(corpus, tmp_path, monkeypatch):
    import uuid

    from lmdata.parallel.staging import StoreStaging
    from lmdata.storage import FsspecStore
    from lmdata.tokenize import pipeline

    run(corpus, tmp_path / "ref", workers=0)
    store = FsspecStore("memory")
    staging = StoreStaging(store, f"/p3-{uuid.uuid4().hex[:8]}/.out.lmdata-work")
    monkeypatch.setattr(pipeline, "staging_for", lambda out, opts: staging)
    job = TokenizeJob(to="flat-tokens", batch_docs=64, validation_fraction=0.1)
    stop_midway = interrupt_at(12)  # inside the second input file
    with pytest.raises(KeyboardInterrupt):
        tokenize([corpus], tmp_path / "out", job, workers=0, progress=stop_midway)
    assert store.list(staging.key + "/done") == ["000000-000000"]
    assert len(store.list(staging.key + "/parts")) >= 8  # a.jsonl's parts, and some of b's
    assert not work_dir_for(tmp_path / "out").exists()  # nothing staged locally
    seen = []
    progress = documents(seen)
    tokenize([corpus], tmp_path / "out", job, workers=0, resume=True, progress=progress)
    assert seen[-1] == 700  # a.jsonl replayed from the store, not tokenized again
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")
    assert not store.exists(staging.key)


def test_storage_options_with_a_local_output_stage_locally(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "hi"}\n')
    job = TokenizeJob(to="flat-tokens")
    s = tokenize([tmp_path / "d.jsonl"], tmp_path / "o", job, workers=0, storage_options={"a": 1})
    assert s.documents_written == 1 and not work_dir_for(tmp_path / "o").exists()


def test_a_kept_pool_reloads_a_tokenizer_file_changed_between_jobs(tmp_path):
    """Workers keep a loaded tokenizer for the next job of a kept pool, unless its file
    changed: a reversed vocabulary must give reversed ids, not the first job's."""
    from lmdata import parallel

    bpe = Path(__file__).parents[1] / "data/modalities/tokenizers/bpe5k/tokenizer.json"
    tok = tmp_path / "tokenizer.json"
    shutil.copy(bpe, tok)
    src = tmp_path / "docs"
    src.mkdir()
    for k in range(4):
        (src / f"{k}.jsonl").write_text(json.dumps({"text": f"hello world {k} " * 50}) + "\n")
    job = TokenizeJob(to="flat-tokens", tokenizer=str(tok))
    try:
        tokenize([src], tmp_path / "a", job, workers=2)
        spec = json.loads(tok.read_text())
        vocab = spec["model"]["vocab"]
        n = len(vocab)
        spec["model"]["vocab"] = {t: n - 1 - i for t, i in vocab.items()}
        tok.write_text(json.dumps(spec))
        tokenize([src], tmp_path / "b", job, workers=2)  # the same pool, a changed file
    finally:
        parallel.shutdown()
    a = np.concatenate(list(lmdata.open(tmp_path / "a")))
    b = np.concatenate(list(lmdata.open(tmp_path / "b")))
    assert len(a) == len(b) and (b == n - 1 - a).all()


def test_one_tokenizer_thread_means_one_batch_encoding_at_a_time(corpus, tmp_path, monkeypatch):
    """In this process two batches encode at once for the tokenizer's thread pool, unless the
    environment keeps the tokenizer to one thread: then two would take two cores."""
    import threading

    from lmdata.tokenize import worker

    real = worker._encode
    lock = threading.Lock()
    now = peak = 0
    two = threading.Event()  # set once two batches encode at once
    wait = [60.0]  # seconds the first batch waits for a second (only a failure waits it out)

    def encode(texts, special):
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
            if now == 2:
                two.set()
        # the first batch waits for the next one to start encoding: no race on a loaded machine
        two.wait(wait[0])
        try:
            return real(texts, special)
        finally:
            with lock:
                now -= 1

    monkeypatch.setattr(worker, "_encode", encode)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    run(corpus, tmp_path / "a", workers=0, batch_docs=100)
    assert peak == 2
    peak = 0
    two.clear()
    wait[0] = 0.005  # one at a time expected: each waits a moment for a second, in vain
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    run(corpus, tmp_path / "b", workers=0, batch_docs=100)
    assert peak == 1
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")


DIE_ENV = "LMDATA_TEST_TOKENIZE_DIE"  # a folder: while it holds "die", input 1's worker dies


def _dies_on_input_1(task):
    """The pipeline's unit function, but the worker that takes input 1 while the marker is
    there removes it and is SIGKILLed (as the kernel's OOM killer would)."""
    marker = os.path.join(os.environ[DIE_ENV], "die")
    if task.unit.file_index == 1 and os.path.exists(marker):
        os.unlink(marker)
        os.kill(os.getpid(), signal.SIGKILL)
    return pipeline_process(task)


def test_a_worker_killed_mid_job_keeps_the_work_for_resume(corpus, tmp_path, monkeypatch):
    """A dead worker (not a data error) fails the job naming its unit, and keeps the staged
    work as Ctrl-C does, so --resume continues where it stopped instead of starting over."""
    from lmdata import parallel
    from lmdata.tokenize import pipeline

    run(corpus, tmp_path / "ref", workers=0)
    (tmp_path / "die").write_bytes(b"")
    monkeypatch.setenv(DIE_ENV, str(tmp_path))
    monkeypatch.setenv(parallel.START_METHOD_ENV, "fork")  # a new pool, forked with the patch
    monkeypatch.setattr(pipeline, "_process", _dies_on_input_1)
    job = TokenizeJob(to="flat-tokens", batch_docs=64, validation_fraction=0.1)
    out = tmp_path / "out"
    with pytest.raises(lmdata.errors.LmdataError, match=r"killed by SIGKILL.*b\.jsonl\.gz"):
        tokenize([corpus], out, job, workers=2, range_bytes=4000)
    assert not out.exists()
    work = work_dir_for(out)
    assert (work / "manifest.json").is_file()  # kept for --resume
    tokenize([corpus], out, job, workers=2, range_bytes=4000, resume=True)
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref") and not work.exists()
