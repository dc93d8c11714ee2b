"""Jobs writing to S3 (the loopback moto server) killed mid-job, then continued: ``lmdata
tokenize``, ``convert`` and ``dedupe`` with ``--resume``, ``tag`` and ``mix`` run again as they
were (they keep the outputs they finished). The job is a real process (with its workers) that
is SIGKILLed right after one of its mutating requests; the command that continues it is the
one the CLI prints (``continue with: ...``) and needs no extra option: the dead run's claim on
the output is taken over, its staged work reused, and the output's bytes are an uninterrupted
run's. Nothing the dead run left stays behind. (The uninterrupted run and the one that
continues run in this process, through click's runner, with the same command line.)"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lmdata.storage import claims, resolve

from ._faults import read

KILLER = str(Path(__file__).with_name("_killcli.py"))
DATA = Path(__file__).parent.parent / "data" / "dolma"


def _cli(args, tmp_path, kill=0, sig="SIGKILL", match=""):
    """Run ``lmdata ARGS`` in its own process group, stopped after its ``kill``-th mutating
    request (of a key holding ``match``); returns (the process's result, the number of such
    requests it sent)."""
    count = tmp_path / "count"
    count.write_bytes(b"")
    env = {**os.environ, "KILL_AFTER": str(kill), "KILL_SIGNAL": sig, "KILL_COUNT": str(count)}
    env["KILL_MATCH"] = match
    res = subprocess.run(
        [sys.executable, KILLER, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
        check=False,
    )
    return res, count.stat().st_size


def _objects(url):
    """Every object below ``url`` by name, with its bytes (claims left out)."""
    store, key = resolve(url)
    store.fs.invalidate_cache()
    base = store.fs._strip_protocol(key).rstrip("/")
    if not store.fs.isdir(base):
        return {"": store.fs.cat_file(base)} if store.fs.exists(base) else {}
    keys = [k for k in sorted(store.fs.find(base)) if ".lmdata-writing" not in k]  # _leftovers'
    return {k[len(base) + 1 :]: store.fs.cat_file(k) for k in keys}


def _leftovers(url):
    """What is left below ``url`` of lmdata's writers: nothing but, at most, claims of
    finished commits (a claim whose removal failed, which the next writer knows for one)."""
    store, key = resolve(url)
    store.fs.invalidate_cache()
    left = sorted(k for k in store.fs.find(key) if ".lmdata-" in k)
    finished = [k for k in left if (c := claims.inspect(store, k)) and c.outcome == "finished"]
    return [k for k in left if k not in finished]


def _remove(url):
    store, key = resolve(url)
    store.remove(key)


def _run(args):
    """``lmdata ARGS`` in this process (the same command line, recorded the same way, as the
    killed process's; no interpreter to start): returns (exit status, stderr, the mutating
    requests this process sent)."""
    from click.testing import CliRunner

    from lmdata.cli.main import cli

    from ._faults import stop_after

    with stop_after(None) as st:
        res = CliRunner().invoke(cli, args)
    return res.exit_code, res.stderr, st.log


def _killed(tmp_path, args, out, resume, sig="SIGKILL", match=""):
    """Run ``args`` through once (as ``args + resume``: a resume with nothing to resume is a
    plain run, and records the same command); then again in a process of its own, killed
    halfway through its requests (or, with ``match``, right after the second request of a
    key holding it). Returns (the reference output's bytes, the killed run's result)."""
    code, err, sent = _run([*args, *resume])
    assert code == 0, err
    ref = _objects(out)
    _remove(out)
    kill = 2 if match else max(3, len(sent) // 2)
    res, _ = _cli(args, tmp_path, kill=kill, sig=sig, match=match)
    assert res.returncode in (-signal.SIGKILL, 130), (res.returncode, res.stderr)
    return ref, res


def _tokenize_input(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for f in range(3):
        with open(src / f"{f}.jsonl", "w") as fh:
            for i in range(150):
                fh.write(json.dumps({"id": f"{f}-{i}", "text": f"doc {f} {i} " * (i % 13 + 1)}))
                fh.write("\n")
    return src


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_tokenize_to_s3_killed_resumes_with_the_printed_command(tmp_path, s3_root, sig):
    src = _tokenize_input(tmp_path)
    out = f"{s3_root}/tok"
    args = ["tokenize", str(src), out, "--to", "flat-tokens", "--workers", "2", "-q"]
    ref, killed = _killed(tmp_path, args, out, ["--resume"], sig)
    assert read("flat-tokens", out) is None  # nothing a reader accepts
    if sig == "SIGINT":  # Ctrl-C says what continues the job
        line = next(x for x in killed.stderr.splitlines() if x.startswith("continue with: "))
        again = shlex.split(line[len("continue with: ") :])
        assert again[0] == "lmdata" and again[1:] == [*args, "--resume"]
    code, err, _ = _run([*args, "--resume"])
    assert code == 0, err
    assert _objects(out) == ref  # the uninterrupted run's bytes
    assert _leftovers(s3_root) == []  # the claim, the staged work: gone


def test_convert_to_s3_killed_resumes(tmp_path, s3_root):
    src = tmp_path / "src.jsonl"
    with open(src, "w") as fh:
        for i in range(1500):
            fh.write(json.dumps({"id": i, "text": f"record {i} " * (i % 7 + 1)}) + "\n")
    out = f"{s3_root}/conv.dolma"
    args = ["convert", str(src), out, "--to", "dolma", "--workers", "2", "-q"]
    ref, _ = _killed(tmp_path, args, out, ["--resume"])
    assert read("dolma", out) is None
    code, err, _ = _run([*args, "--resume"])
    assert code == 0, err
    assert _objects(out) == ref
    assert _leftovers(s3_root) == []


def _dolma_tree(root):
    """Six document files of the test tree on the store (a job of several units)."""
    store, key = resolve(root)
    docs = [
        line
        for part in ("part-0.jsonl.gz", "part-1.jsonl.gz")
        for line in gzip.decompress((DATA / "dataset/documents" / part).read_bytes()).splitlines()
    ]
    for f in range(6):
        body = b"\n".join(docs[f::6]) + b"\n"
        store.put(f"{key}/documents/p{f}.jsonl.gz", gzip.compress(body, mtime=0))


@pytest.mark.parametrize("verb", ["tag", "dedupe", "mix"])
def test_dolma_toolkit_on_s3_killed_continues(tmp_path, s3_root, verb):
    root = f"{s3_root}/ds"
    _dolma_tree(root)
    docs = f"{root}/documents/*.jsonl.gz"
    if verb == "tag":
        args = ["tag", "-d", docs, "-t", "char_length_v1", "-e", "exp", "-p", "2", "-q"]
        out, resume = f"{root}/attributes/exp", []
    elif verb == "dedupe":
        args = ["dedupe", "-d", docs, "--dedupe.name", "dd", "-p", "2", "-q"]
        args += ["--dedupe.paragraphs.attribute_name", "bff_duplicate_paragraph_spans"]
        out, resume = f"{root}/attributes/dd", ["--resume"]
    else:
        config = tmp_path / "mix.json"
        stream = {
            "name": "m",
            "documents": [docs],
            "output": {"path": f"{s3_root}/mixed", "max_size_in_bytes": 5000},
            "filter": {"include": ["$.id"]},
        }
        config.write_text(json.dumps({"streams": [stream], "processes": 2}))
        args = ["mix", "-c", str(config), "-q"]
        out, resume = f"{s3_root}/mixed", []
    # killed with an output file under way (its claim written): the file a plain rerun of the
    # job (or dedupe's --resume) must take over
    ref, _ = _killed(tmp_path, args, out, resume, match=".lmdata-writing")
    code, err, _ = _run([*args, *resume])
    assert code == 0, err
    assert _objects(out) == ref, err
    assert _leftovers(s3_root) == [], err


def _job(kind, src, out, resume=False):
    """tokenize or convert ``src`` into ``out`` in this process."""
    import lmdata
    from lmdata.convert import convert

    if kind == "tokenize":
        return lmdata.tokenize(str(src), out, format="flat-tokens", workers=0, resume=resume)
    return convert(str(src), out, "dolma", workers=0, resume=True)  # staged from the first run


@pytest.mark.parametrize("kind", ["tokenize", "convert"])
def test_a_job_stopped_after_any_request_resumes_to_the_same_bytes(tmp_path, s3_root, kind):
    """tokenize and convert to S3 stopped right after each kind of their mutating requests (in
    this process, as tests/storage/test_faults_writes.py stops writers): a reader accepts
    nothing (or, stopped after the commit, the whole output), and the resume gives the
    uninterrupted run's bytes."""
    from ._faults import points, stop_after

    src = _tokenize_input(tmp_path) if kind == "tokenize" else _records(tmp_path)
    fmt = "flat-tokens" if kind == "tokenize" else "dolma"
    out = f"{s3_root}/out"
    with stop_after(None) as full:
        _job(kind, src, out)
    ref, records = _objects(out), read(fmt, out)
    _remove(out)
    for k in points(full.log, 3):
        with stop_after(k) as st, pytest.raises(Exception):  # noqa: B017
            _job(kind, src, out)
        assert st.stopped
        # nothing, or (stopped after its commit, before removing its work) the whole output
        assert read(fmt, out) in (None, records), (k, full.log[:k])
        try:
            _job(kind, src, out, resume=True)
        except Exception as e:
            raise AssertionError((k, full.log[:k], full.log[k:])) from e
        assert _objects(out) == ref, (k, full.log[:k])
        assert _leftovers(s3_root) == []
        _remove(out)


def _records(tmp_path):
    src = tmp_path / "src.jsonl"
    with open(src, "w") as fh:
        for i in range(1500):
            fh.write(json.dumps({"id": i, "text": f"record {i} " * (i % 7 + 1)}) + "\n")
    return src


def test_a_resume_takes_over_its_jobs_claim_from_another_machine(tmp_path, s3_root):
    """A job killed on another machine: whether its writer still runs cannot be told from
    here, so a plain run is refused (naming `lmdata clean`), while ``--resume`` of the same job
    (the claim names its work area) takes the claim over."""
    from lmdata.errors import OutputExistsError

    from ._faults import stop_after

    src = _tokenize_input(tmp_path)
    out = f"{s3_root}/out"
    with stop_after(None) as full:
        _job("tokenize", src, out)
    ref = _objects(out)
    _remove(out)
    data = [i for i, (m, k) in enumerate(full.log) if m == "put_object" and "/out/" in k]
    with stop_after(data[0] + 1), pytest.raises(Exception):  # noqa: B017
        _job("tokenize", src, out)  # stopped with an object of the output written
    store, key = resolve(out)
    claim = claims.claim_key(key)
    body = json.loads(store.read(claim))
    store.put(claim, json.dumps({**body, "machine": "another"}).encode())
    with pytest.raises(OutputExistsError, match="--claims --older-than 0"):
        _job("tokenize", src, out)
    _job("tokenize", src, out, resume=True)
    assert _objects(out) == ref
    assert _leftovers(s3_root) == []
