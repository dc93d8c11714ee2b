"""lmdata.inspect.stats on generated datasets: every figure checked against what was written."""

from __future__ import annotations

import gzip
import html
import json
import re

import numpy as np
import pytest

import lmdata
from lmdata.inspect import report
from lmdata.inspect.stats import compute, histogram


@pytest.fixture()
def tokens_ds(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 50, size=n) for n in [0, 3, 10, 100, 7, 7, 1000]]
    seqs.append(np.full(20, 77))  # id 77 is the most frequent: 20 plus whatever rng drew (none)
    p = tmp_path / "t.zarr"
    with lmdata.writer(p, "flat-tokens") as w:
        for s in seqs:
            w.write(s)
        w.write([1, 2], split="validation")
    return p, seqs


def test_token_dataset_exact_figures(tokens_ds):
    p, seqs = tokens_ds
    s = compute(p, tokenizer="bytes", top=5)
    lengths = np.array([len(x) for x in seqs])
    allt = np.concatenate(seqs)
    assert s["kind"] == "tokens" and s["format"] == "flat-tokens"
    assert s["splits"] == ["train", "validation"]
    assert s["records"] == len(seqs)
    assert s["tokens"] == int(lengths.sum())
    assert s["max_token_id"] == 77
    d = s["lengths"]
    assert (d["min"], d["max"], d["empty"], d["total"]) == (0, 1000, 1, int(lengths.sum()))
    assert d["median"] == pytest.approx(np.median(lengths))
    assert sum(d["histogram"]["counts"]) == len(seqs)
    ids, counts = np.unique(allt, return_counts=True)
    order = np.lexsort((ids, -counts))[:5]
    assert [(t["id"], t["count"]) for t in s["top_tokens"]] == [
        (int(ids[i]), int(counts[i])) for i in order
    ]
    assert s["distinct_token_ids"] == len(ids)
    assert s["top_tokens"][0]["share"] == pytest.approx(counts[order[0]] / allt.size)
    # byte tokenizer: id i is byte i-1
    assert all(t["text"] == chr(t["id"] - 1) for t in s["top_tokens"])
    assert s["sample"]["sampled"] is False
    v = compute(p, split="validation")
    assert (v["records"], v["tokens"], v["split"]) == (1, 2, "validation")
    assert "text" not in v["top_tokens"][0]


def test_token_frequencies_are_sampled_above_the_budget(tokens_ds):
    p, seqs = tokens_ds
    total = sum(len(x) for x in seqs)
    s = compute(p, sample_tokens=100, top=1000)  # every id seen is listed
    sample = s["sample"]
    assert sample["sampled"] is True and sample["what"] == "token frequencies"
    assert s["tokens"] == total  # counts stay exact
    assert sample["tokens_read"] == 100 < total  # read what the budget allows, not everything
    assert sum(t["count"] for t in s["top_tokens"]) == sample["tokens_read"]
    assert sample["windows"] * sample["window_tokens"] == 100
    assert compute(p, sample_tokens=100, top=1000) == s  # seeded: the same windows
    full = compute(p, sample_tokens=100, full=True, top=1000)
    assert full["sample"]["sampled"] is False and full["sample"]["tokens_read"] == total
    assert sum(t["count"] for t in full["top_tokens"]) == total
    # a budget that covers the dataset reads everything and does not claim to sample
    assert compute(p, sample_tokens=total)["sample"]["sampled"] is False


def test_the_tokenizer_is_resolved_before_reading(tokens_ds, monkeypatch):
    from lmdata.errors import InvalidInputError
    from lmdata.inspect import stats

    p, _ = tokens_ds

    def no_reading(*args, **kwargs):
        raise AssertionError("opened the dataset before checking the tokenizer")

    monkeypatch.setattr(stats, "open_dataset", no_reading)
    with pytest.raises(InvalidInputError, match="tokenizer file not found"):
        compute(p, tokenizer="missing-tokenizer.json")


def test_token_counter_mixes_dense_and_sparse_counts():
    from lmdata.inspect.stats import _TokenCounter

    c = _TokenCounter(9)  # ids 0..9 counted densely; a window with a larger id goes sparse
    c.add(np.array([1, 1, 2], np.uint32))
    c.add(np.array([1, 50, 50, 3], np.uint16))
    assert c.top(10) == [(1, 3), (50, 2), (2, 1), (3, 1)]
    assert c.distinct() == 4 and c.total == 7
    r = _TokenCounter(-1)  # records: vocabulary unknown
    for a in ([5, 5], [7], [5]):
        r.add(np.array(a, np.int64))
    assert r.top(1) == [(5, 3)] and r.distinct() == 2


@pytest.fixture()
def dolma_ds(tmp_path):
    p = tmp_path / "d.dolma"
    docs = [
        {"id": str(i), "text": "x" * i, "source": "web" if i % 3 else "books"} for i in range(30)
    ]
    with lmdata.writer(p, "dolma", max_file_docs=10) as w:
        for d in docs:
            w.write(d)
    for f in sorted((p / "documents").glob("*.jsonl.gz")):
        rows = [json.loads(x) for x in gzip.open(f, "rt")]
        out = p / "attributes" / "len" / f.name
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(out, "wt") as g:
            for r in rows:
                n = len(r["text"])
                spans = [[0, n, float(n)]] if n % 2 == 0 else []
                g.write(json.dumps({"id": r["id"], "attributes": {"len__even": spans}}) + "\n")
    return p, docs


def test_records_sources_and_attributes(dolma_ds):
    p, _ = dolma_ds
    s = compute(p)
    assert s["kind"] == "records" and s["records"] == 30
    assert s["lengths"]["unit"] == "characters"
    assert s["lengths"]["total"] == sum(range(30)) == s["text_bytes"]
    assert s["sources"] == {
        "web": {"records": 20, "characters": sum(i for i in range(30) if i % 3)},
        "books": {"records": 10, "characters": sum(i for i in range(30) if i % 3 == 0)},
    }
    a = s["attributes"]["len__even"]
    evens = [i for i in range(30) if i % 2 == 0]
    assert a["records"] == 30 and a["spans"] == len(evens)
    assert a["values"] == {
        "count": len(evens),
        "min": 0.0,
        "mean": pytest.approx(sum(evens) / len(evens)),
        "max": 28.0,
    }
    assert s["fields"]["text"] == {"str": 30}
    assert s["sample"]["sampled"] is False and "estimated" not in s


def test_records_are_sampled_and_say_so(dolma_ds):
    p, _ = dolma_ds
    s = compute(p, sample_records=10, seed=3)
    assert s["sample"] == {"sampled": True, "what": "records", "records_read": 10, "seed": 3}
    assert s["records"] == 30 and s["lengths"]["count"] == 10
    assert s["estimated"]["characters"] == s["lengths"]["total"] * 3
    assert compute(p, sample_records=10, seed=3) == s  # seeded: the same sample
    assert "sampled 10 of 30 records" in report.text(s)
    assert compute(p, sample_records=10, full=True)["lengths"]["count"] == 30


def test_token_array_records(tmp_path):
    p = tmp_path / "a.atlas"
    with lmdata.writer(p, "atlas") as w:
        for n in (1, 2, 3):
            w.write({"tokens": np.full(n, n, dtype=np.uint16)})
    s = compute(p)
    assert s["lengths"]["unit"] == "tokens" and s["tokens"] == 6
    assert [(t["id"], t["count"]) for t in s["top_tokens"]] == [(3, 3), (2, 2), (1, 1)]


def test_histogram_scales():
    h = histogram(np.arange(100), bins=10)
    assert h["scale"] == "linear" and sum(h["counts"]) == 100 and len(h["edges"]) == 11
    wide = histogram(np.array([1, 10, 100, 10_000, 100_000]), bins=5)
    assert wide["scale"] == "log" and sum(wide["counts"]) == 5
    assert histogram(np.array([4, 4]))["counts"] == [2]
    assert histogram(np.array([]))["counts"] == []


def test_reports_escape_and_render(dolma_ds, tmp_path):
    p, _ = dolma_ds
    s = compute(p)
    s["sources"]["<script>alert(1)</script>"] = {"records": 1, "characters": 1}
    page = report.html_page(s)
    assert "<script>" not in page and "&lt;script&gt;" in page and "<svg" in page
    assert "by source" in report.text(s) and "len__even" in report.text(s)
    pytest.importorskip("matplotlib")
    out = tmp_path / "s.png"
    report.plot_png(s, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


WHITESPACE = ["\n       ", "\n   ", "\n ", " the", "\t", "a b\u2423"]


def _with_tokens(texts: list[str]) -> dict:
    top = [{"id": i, "count": 100 - i, "share": 0.01, "text": t} for i, t in enumerate(texts)]
    return {"path": "p", "format": "flat-tokens", "kind": "tokens", "records": 1, "top_tokens": top}


SHOWN = ["'\\n␣␣␣␣␣␣␣'", "'\\n␣␣␣'", "'\\n␣'", "'␣the'", "'\\t'", "'a␣b\\u2423'"]


def test_whitespace_tokens_read_apart_in_html():
    """A browser collapses runs of whitespace: the tokens '\\n       ', '\\n   ' and '\\n '
    read the same unless their spaces are shown."""
    page = report.html_page(_with_tokens(WHITESPACE))
    cells = re.findall(r"<tr><td>\d+</td><td>[\d,]+</td><td>[\d.]+%</td><td>(.*?)</td>", page)
    seen = [re.sub(r"\s+", " ", html.unescape(c)) for c in cells]  # as a browser shows them
    assert seen == SHOWN
    assert report.text(_with_tokens(WHITESPACE)).count("␣") == sum(s.count("␣") for s in SHOWN)


def test_whitespace_tokens_read_apart_in_the_png(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    given = []
    real = Axes.set_xticks

    def record(self, ticks, labels=None, **kw):
        given.append(list(labels or []))
        return real(self, ticks, labels, **kw)

    monkeypatch.setattr(Axes, "set_xticks", record)
    report.plot_png(_with_tokens([*WHITESPACE, "$x$"]), tmp_path / "s.png")
    assert given == [[*SHOWN, "'\\$x\\$'"]]  # mathtext's $ escaped, as before
