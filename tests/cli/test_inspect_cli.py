"""`lmdata cat --decode`, `lmdata stats`, and progress lines when stderr is not a terminal."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.tokenize import load_tokenizer
from tests.inspect.conftest import CORPUS, bpe_file  # noqa: F401  (a fixture)

ROOT = Path(__file__).parents[2]
TEXTS = ["hello world", "", "héllo wörld 日本語\nsecond line", "<script>alert(1)</script>"]


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def write_tokens(path: Path, tokenizer, texts=TEXTS) -> Path:
    tok = load_tokenizer(tokenizer)
    with lmdata.writer(path, "flat-tokens") as w:
        for ids in tok.encode_batch(texts):
            w.write(ids)
    return path


@pytest.mark.parametrize("which", ["bytes", "hf"])
def test_cat_decode_gives_back_the_text(tmp_path, bpe_file, which):  # noqa: F811
    spec = "bytes" if which == "bytes" else str(bpe_file)
    p = write_tokens(tmp_path / "t.zarr", spec)
    res = run("cat", str(p), "--decode", "--tokenizer", spec)
    assert res.exit_code == 0, res.output
    lines = [orjson.loads(x) for x in res.output.splitlines()]
    assert lines == [{"index": i, "split": "train", "text": t} for i, t in enumerate(TEXTS)]
    raw = run("cat", str(p), "--decode", "--tokenizer", spec, "--raw", "-n", "1", "--offset", "2")
    assert raw.output == TEXTS[2] + "\n"


def test_info_and_cat_decode_take_an_mds_root_with_split_directories(tmp_path):
    # streaming's layout (root/train, root/val, each with its index.json): info summarised
    # neither ("open one with split=NAME", which the CLI had no way to) and cat --split failed
    src = tmp_path / "a.jsonl"
    texts = [t for t in TEXTS if t]  # streaming refuses empty arrays
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    root = tmp_path / "m"
    for name in ("train", "val"):
        res = run(
            "tokenize", str(src), str(root / name), "--tokenizer", "bytes", "--to", "mds", "-q"
        )
        assert res.exit_code == 0, res.output
    summary = lmdata.info(root)
    assert sorted(summary["splits"]) == ["train", "val"]
    assert summary["splits"]["val"]["samples"] == len(texts)
    res = run("cat", str(root), "--split", "val", "--decode", "-n", "2")
    assert res.exit_code == 0, res.output
    lines = [orjson.loads(x) for x in res.output.splitlines()]
    assert lines == [{"index": i, "split": "val", "text": t} for i, t in enumerate(texts[:2])]


def test_cat_decode_records_and_usage_errors(tmp_path):
    p = tmp_path / "a.atlas"
    tok = load_tokenizer("bytes")
    with lmdata.writer(p, "atlas") as w:
        w.write({"tokens": tok.encode("abc"), "n": 1})
    assert orjson.loads(run("cat", str(p), "--decode", "--tokenizer", "bytes").output) == {
        "index": 0,
        "text": "abc",
        "n": 1,
    }
    res = CliRunner().invoke(cli, ["cat", str(p), "--decode"])
    assert res.exit_code == 2 and "does not record the tokenizer" in res.output, res.output
    res = CliRunner().invoke(cli, ["cat", str(p), "--tokenizer", "bytes"])
    assert res.exit_code == 2 and "go with --decode" in res.output
    z = write_tokens(tmp_path / "t.zarr", "bytes")
    res = CliRunner().invoke(cli, ["cat", str(z), "--decode", "--tokenizer", "nope.json"])
    assert res.exit_code == 2 and "tokenizer file not found" in res.output


def test_stats_json_and_text(tmp_path, bpe_file):  # noqa: F811
    p = write_tokens(tmp_path / "t.zarr", str(bpe_file), CORPUS)
    res = run("stats", str(p), "--json", "--tokenizer", str(bpe_file), "--top", "3", "-q")
    s = json.loads(res.output)
    ids = load_tokenizer(bpe_file).encode_batch(CORPUS)
    assert s["records"] == len(CORPUS)
    assert s["tokens"] == sum(len(x) for x in ids)
    assert s["max_token_id"] == max(int(x.max()) for x in ids)
    assert s["lengths"]["max"] == max(len(x) for x in ids)
    assert len(s["top_tokens"]) == 3 and all("text" in t for t in s["top_tokens"])
    html, png = tmp_path / "s.html", tmp_path / "s.png"
    res = run("stats", str(p), "--html", str(html), "-q")
    assert res.exit_code == 0
    assert "tokens per record" in res.output and "(--tokenizer FILE shows their text)" in res.output
    assert html.read_text().startswith("<!doctype html>")
    pytest.importorskip("matplotlib")
    assert run("stats", str(p), "--plot", str(png), "-q").exit_code == 0
    assert png.stat().st_size > 1000


def _lmdata(*args: str, interval: str = "0") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LMDATA_PROGRESS_INTERVAL=interval)
    return subprocess.run(
        [sys.executable, "-m", "lmdata.cli", *args],
        capture_output=True,  # stderr is a pipe, not a terminal
        text=True,
        env=env,
        timeout=300,
        check=True,
    )


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * 50}) + "\n" for i in range(300)))
    dst = tmp_path / "out.zarr"
    err = _lmdata("tokenize", str(src), str(dst), "--to", "flat-tokens", "--workers", "0").stderr
    lines = [x for x in err.splitlines() if x.startswith("tokenize: ")]
    assert lines, err
    assert "\r" not in err and "█" not in err  # plain lines, not a bar
    assert any("ETA" in x for x in lines) or len(lines) == 1
    assert "done" in lines[-1] and "300 documents" in lines[-1] and "tokens" in lines[-1]
    err = _lmdata("stats", str(dst)).stderr
    assert "stats: done" in err
    assert _lmdata("stats", str(dst), "--quiet").stderr == ""
    out = _lmdata("tokenize", str(src), str(dst), "--to", "flat-tokens", "--overwrite", "-q")
    assert out.stderr == ""


def test_demo_table_explains_itself(tmp_path):
    from lmdata.demo import run as run_demo

    lines: list[str] = []
    result = run_demo(tmp_path, limit=30, steps=2, workers=0, log=lines.append)
    for row in result["datasets"]:  # sizes as lmdata info reports them; tokens for all but docs
        assert row["MB"] == lmdata.info(tmp_path / row["dataset"])["bytes_on_disk"] / 1e6
        documents = row["dataset"] == "stdlib.dolma" or row["dataset"].startswith("docs.")
        assert ("tokens" in row) != documents, row
    text = "\n".join(lines)
    for heading in ("What the columns measured", "Why the counts differ", "Try next:"):
        assert heading in text
    header = next(x for x in lines if x.startswith("dataset "))
    for column in ("records", "tokens", "MB", "B/token", "read Mtok/s", "valid"):
        assert column in header and f"  {column.split()[0]}" in text  # each one explained
    splits = lmdata.info(tmp_path / "stdlib.flat-tokens")["splits"]
    train, val = splits["train"], splits["validation"]
    pbin = lmdata.info(tmp_path / "stdlib.pbin")["tokens"]
    assert f"{train['sequences']:,} train + {val['sequences']:,} validation" in text
    eod = pbin - train["tokens"] - val["tokens"]
    assert eod == 30 and f"+ {eod:,} EOD" in text  # one EOD per document
    assert f"lmdata view {tmp_path}/stdlib.flat-tokens\n" in text
    # the next steps work as printed: the datasets record their tokenizer
    cat = next(x for x in text.splitlines() if "lmdata cat " in x)
    res = run(*cat.split()[1:])
    assert res.exit_code == 0 and orjson.loads(res.output)["text"].strip(), res.output


@pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")
def test_make_demo_installs_only_the_main_venv():
    dry = subprocess.run(
        ["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "lmdata demo" in dry
    for tool in ("extra-zarr2", "extra-streaming", "torch", "chromium", "[dev"):
        assert tool not in dry, tool
    test = subprocess.run(
        ["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for tool in ("extra-zarr2", "mosaicml-streaming", "torch==2.13.0", "chromium", "[dev"):
        assert tool in test, tool


def test_view_command_serves_on_loopback(tmp_path):
    import urllib.request

    p = write_tokens(tmp_path / "t.zarr", "bytes")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "lmdata.cli", "view", str(p), "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--tokenizer", "bytes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("lmdata view: http://127.0.0.1:"), line
        url = line.split()[2]  # http://127.0.0.1:PORT/?token=...: the API needs the token
        api = url.replace("/?token=", "/api/records?start=2&count=1&token=")
        with urllib.request.urlopen(api, timeout=30) as r:
            item = json.loads(r.read())["items"][0]
        assert "".join(piece for _, piece in item["tokens"]["pieces"]) == TEXTS[2]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with socket.socket() as taken:  # a port in use is a one-line error, not a traceback
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = subprocess.run(
            [*cmd[:-1], str(taken.getsockname()[1])],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert busy.returncode == 2 and "choose another with --port" in busy.stderr, busy.stderr


def test_cat_decode_raw_prints_the_decoded_field_of_records(tmp_path):
    p = tmp_path / "a.atlas"
    tok = load_tokenizer("bytes")
    with lmdata.writer(p, "atlas") as w:
        for t in ("first doc", "second doc"):
            w.write({"id": f"id-{t}", "tokens": tok.encode(t)})
    res = run("cat", str(p), "--decode", "--tokenizer", "bytes", "--raw")
    assert res.output == "first doc\nsecond doc\n"  # the text, not the id


def test_cat_decode_raw_drops_no_record_without_text(tmp_path):
    p = tmp_path / "a.atlas"
    with lmdata.writer(p, "atlas") as w:
        w.write({"id": "a", "text": "has text"})
        w.write({"id": "b", "body": "no text field"})
    res = run("cat", str(p), "--decode", "--tokenizer", "bytes", "--raw")
    lines = res.output.splitlines()
    assert lines[0] == "has text" and json.loads(lines[1]) == {"id": "b", "body": "no text field"}


def test_stats_checks_its_outputs_before_reading(tmp_path, monkeypatch):
    from lmdata.inspect import stats

    p = write_tokens(tmp_path / "t.zarr", "bytes")
    monkeypatch.setattr(stats, "open_dataset", lambda *a, **k: pytest.fail("read the dataset"))
    res = CliRunner().invoke(cli, ["stats", str(p), "--html", str(tmp_path / "no" / "s.html")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = CliRunner().invoke(cli, ["stats", str(p), "--tokenizer", "nope.json"])
    assert res.exit_code == 2 and "tokenizer file not found" in res.output


def test_stats_and_view_take_urls(tmp_path):
    from lmdata.view.data import ViewData

    url = "memory://inspect3-cli/t.zarr"
    write_tokens(url, "bytes")
    res = run("stats", url, "--json", "-q", "--tokenizer", "bytes")
    assert res.exit_code == 0 and json.loads(res.output)["records"] == len(TEXTS)
    assert ViewData(url).page(0, 1)["records"] == len(TEXTS)
    res = run("cat", url, "-n", "1", "--storage-option", "use_listings_cache=false")
    assert res.exit_code == 0 and json.loads(res.output)["index"] == 0


def test_view_reports_a_dataset_error_as_such(tmp_path, monkeypatch):
    from lmdata import view
    from lmdata.errors import DatasetNotFoundError

    def missing(*args, **kwargs):  # a FileNotFoundError (an OSError), as a missing shard is
        raise DatasetNotFoundError("shard 7 is missing", path="ds/7")

    monkeypatch.setattr(view, "ViewData", missing)
    p = write_tokens(tmp_path / "t.zarr", "bytes")
    res = CliRunner().invoke(cli, ["view", str(p), "--port", "0"])
    assert res.exit_code == 2 and "shard 7 is missing" in res.output
    assert "cannot listen" not in res.output


def _full_info(monkeypatch):
    """Make stats and cat --decode ask for the whole ``info`` again (the old behaviour)."""
    import lmdata.cli.cat
    import lmdata.inspect.stats
    from lmdata._api import info

    def full(*args, scan=True, **kwargs):
        return info(*args, **kwargs)

    monkeypatch.setattr(lmdata.inspect.stats, "dataset_info", full)
    monkeypatch.setattr(lmdata.cli.cat, "dataset_info", full)


def test_stats_decodes_a_dolma_tree_once_with_the_same_output(tmp_path, monkeypatch):
    from lmdata.formats.dolma import _lines

    p = tmp_path / "tree"
    with lmdata.writer(p, "dolma", max_file_docs=2) as w:
        for i, t in enumerate(["a b", "c", "d e f", "g"]):
            w.write({"id": str(i), "text": t, "source": "s"})
    files = len(list((p / "documents").rglob("*.gz")))
    built = []
    build = _lines.LineIndex._build
    monkeypatch.setattr(_lines.LineIndex, "_build", lambda self: (built.append(1), build(self)))
    fast = run("stats", str(p), "--json", "-q")
    assert fast.exit_code == 0, fast.output
    assert len(built) == files == 2  # the reader's pass only: info counted them all again
    built.clear()
    _full_info(monkeypatch)
    assert run("stats", str(p), "--json", "-q").output == fast.output and len(built) == 2 * files


def test_stats_and_cat_decode_do_not_scan_a_pbin_for_info(tmp_path, monkeypatch):
    from lmdata.formats.modalities.reader import PackedTokens

    p = tmp_path / "o.pbin"
    lmdata.tokenize(iter(TEXTS), p, tokenizer="bytes", format="modalities", append_eod=False)
    scans = []
    prop = PackedTokens.max_token_id

    def counted(self):  # a pass over the tokens when not yet cached
        if self._max_token_id is None:
            scans.append(1)
        return prop.fget(self)

    monkeypatch.setattr(PackedTokens, "max_token_id", property(counted))
    cat = run("cat", str(p), "--decode")
    assert [orjson.loads(x)["text"] for x in cat.output.splitlines()] == TEXTS
    assert scans == []  # the tokenizer comes from the provenance: no pass over the tokens
    stats = run("stats", str(p), "--json", "-q")
    assert stats.exit_code == 0 and len(scans) == 1  # stats' own largest id (it was 2)
    _full_info(monkeypatch)
    assert run("cat", str(p), "--decode").output == cat.output
    assert run("stats", str(p), "--json", "-q").output == stats.output
    assert orjson.loads(stats.output)["model_vocab_size"] == 257


def test_stats_counts_a_plain_jsonl_file_once(tmp_path, monkeypatch):
    from lmdata.formats.modalities_jsonl import plain

    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    scans = []
    scan = plain.scan_object
    monkeypatch.setattr(plain, "scan_object", lambda *a, **k: (scans.append(1), scan(*a, **k))[1])
    fast = run("stats", str(p), "--json", "-q")
    assert fast.exit_code == 0 and orjson.loads(fast.output)["records"] == len(TEXTS)
    assert len(scans) == 1
    _full_info(monkeypatch)
    assert run("stats", str(p), "--json", "-q").output == fast.output and len(scans) == 3


@pytest.mark.parametrize(
    ("fmt", "name", "tokens"),
    [
        ("flat-tokens", "d.zarr", True),
        ("modalities", "d.pbin", True),
        ("atlas", "d.atlas", False),
        ("mds", "d.mds", False),
        ("modalities-jsonl", "d.jsonl", False),
        ("jsonl", "p/d.jsonl", False),
        ("dolma", "d.dolma", False),
    ],
)
def test_info_without_a_scan_is_part_of_the_full_info(tmp_path, fmt, name, tokens):
    # what stats and cat --decode use (format, sizes, provenance, attribute sets) is the same
    import numpy as np

    p = tmp_path / name
    p.parent.mkdir(exist_ok=True)
    opts = {"columns": {"id": "str", "text": "str"}} if fmt == "mds" else {}
    with lmdata.writer(p, fmt, **opts) as w:
        for i in range(5):
            rec = {"id": str(i), "text": "a b"} | ({"source": "s"} if fmt == "dolma" else {})
            w.write(np.arange(1, i + 3) if tokens else rec)
    full, light = lmdata.info(p), lmdata.info(p, scan=False)
    assert light.items() <= full.items() and {"format", "bytes_on_disk"} <= light.keys()
