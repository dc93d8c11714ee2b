"""Acceptance checks of issue 16's harness that no other test pinned: pairs run interleaved,
the ratio is the median of the agreeing pairs' ratios, and a row slower than in the previous
run of the same mode is flagged REGRESSION."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def compare(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("_compare_acceptance", BENCH / "_compare.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    # each timed call starts with gc.collect(): a full pass over the test process's heap (late
    # in the suite millions of objects, seconds per pass); the harness logic needs none
    monkeypatch.setattr(mod, "gc", types.SimpleNamespace(collect=lambda *args: 0))
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    yield mod
    sys.modules.pop("_compare_acceptance", None)


def _runs(log: list[str], name: str, times: list[float], outputs: list[str]):
    it = iter(zip(times, outputs, strict=True))

    def run():
        log.append(name)
        return next(it)

    return run


def test_pairs_alternate_and_the_ratio_is_the_median_of_agreeing_pairs(compare):
    log: list[str] = []
    a = _runs(log, "A", [1.0, 1.0, 2.0, 1.0, 1.0], ["x", "x", "x", "x", "x"])
    b = _runs(log, "B", [2.0, 3.0, 2.0, 10.0, 9.0], ["x", "x", "x", "x", "DIFF"])
    row = compare.compare("t", "row", a, b, pairs=5)
    assert log == ["A", "B"] * 5  # interleaved, never all of one then the other
    # agreeing pairs' ratios 2, 3, 1, 10 (the fifth pair differs: dropped): median 2.5
    assert row.pairs == 4 and row.ratio == pytest.approx(2.5)
    assert row.lmdata_s == pytest.approx(1.0) and row.other_s == pytest.approx(2.5)
    assert "differed in 1 pairs" in row.note
    skew = compare.compare(
        "t",
        "skew",
        _runs(log, "A", [1.0, 4.0, 4.0], ["y"] * 3),
        _runs(log, "B", [3.0, 4.0, 8.0], ["y"] * 3),
        pairs=3,
    )
    # pair ratios 3, 1, 2 -> median 2; median times 4 / 4 would say 1
    assert skew.ratio == pytest.approx(2.0)


def test_each_run_starts_from_a_collected_heap_unless_the_row_opts_out(compare, monkeypatch):
    log: list[str] = []
    monkeypatch.setattr(compare.gc, "collect", lambda *a: log.append("gc") or 0)
    a = _runs(log, "A", [1.0] * 3, ["x"] * 3)
    b = _runs(log, "B", [2.0] * 3, ["x"] * 3)
    compare.compare("t", "row", a, b, pairs=3)
    assert log == ["gc", "A", "gc", "B"] * 3  # before each run (a run times itself), not in it
    log.clear()
    compare.compare("t", "alone", _runs(log, "A", [1.0], ["x"]), None, pairs=3)
    assert log == ["gc", "A"]
    log.clear()
    a, b = _runs(log, "A", [1.0], ["x"]), _runs(log, "B", [1.0], ["x"])
    compare.compare("t", "as a long job", a, b, pairs=1, collect=False)
    assert log == ["A", "B"]


def _saved(
    compare, stamp: str, rows: list[dict], values: tuple[dict, ...] = (), mode: str = "full"
) -> None:
    """An earlier run's results file, as save_and_flag writes it."""
    compare.RESULTS.mkdir(parents=True, exist_ok=True)
    old = {"mode": mode, "rows": rows, "values": list(values)}
    (compare.RESULTS / f"{stamp}-{mode}.json").write_text(json.dumps(old))


def _row(table: str, name: str, ratio: float | None, lmdata_s: float) -> dict:
    return {"table": table, "name": name, "ratio": ratio, "lmdata_s": lmdata_s}


def test_a_row_slower_than_in_the_previous_run_is_flagged(compare, capsys):
    _saved(
        compare,
        "20000101T000000",
        [
            _row("t", "fell", 3.0, 1.0),
            _row("t", "held", 3.0, 1.0),
            _row("t", "own", None, 1.0),  # a row with no other column: its own time counts
            _row("t", "own ok", None, 1.0),
        ],
    )
    # another mode: ignored
    _saved(compare, "20000101T000000", [_row("t", "fell", 100.0, 1.0)], mode="quick")
    compare.compare("t", "fell", lambda: (1.0, 0), lambda: (2.0, 0), pairs=1)  # 3x -> 2x
    compare.compare("t", "held", lambda: (1.0, 0), lambda: (2.8, 0), pairs=1)  # within 10%
    compare.compare("t", "own", lambda: (1.5, 0), None)  # 1.0 s -> 1.5 s
    compare.compare("t", "own ok", lambda: (1.05, 0), None)
    compare.compare("t", "new row", lambda: (1.0, 0), lambda: (0.5, 0), pairs=1)
    out = compare.save_and_flag()
    printed = capsys.readouterr().out
    assert "compared with 20000101T000000-full.json" in printed
    assert "REGRESSION: t / fell: ratio 3.00x -> 2.00x" in printed
    assert "REGRESSION: t / own: time 1.000 s -> 1.500 s" in printed
    assert printed.count("REGRESSION") == 2  # held, own ok and the new row are not flagged
    saved = json.loads(out.read_text())
    assert saved["mode"] == "full" and {r["name"] for r in saved["rows"]} >= {"fell", "new row"}


def test_no_previous_run_or_no_slower_row_says_so(compare, capsys):
    compare.compare("t", "row", lambda: (1.0, 0), lambda: (2.0, 0), pairs=1)
    compare.save_and_flag()
    assert "no previous results file to compare with" in capsys.readouterr().out
    for f in compare.RESULTS.iterdir():  # this run's files; the previous run is written below
        f.unlink()
    # 2.1x then, 2.0x now: within 10%
    _saved(compare, "20000101T000000", [_row("t", "row", 2.1, 1.0)])
    compare.save_and_flag()
    printed = capsys.readouterr().out
    assert "REGRESSION" not in printed and "no row got slower by more than 10%" in printed


def test_the_comparison_names_the_file_it_read(compare, monkeypatch, capsys):
    _saved(compare, "20000101T000000", [_row("t", "row", 3.0, 1.0)])
    (compare.RESULTS / "20000102T000000-full.json").write_text('{"mode": "fu')  # a killed run's
    compare.compare("t", "row", lambda: (1.0, 0), lambda: (2.0, 0), pairs=1)
    compare.save_and_flag()
    printed = capsys.readouterr().out
    assert "skipped unreadable results files: 20000102T000000-full.json" in printed
    assert "compared with 20000101T000000-full.json" in printed
    assert "REGRESSION: t / row: ratio 3.00x -> 2.00x" in printed  # read from the older file
    # a second run in the same second writes a file of its own and compares with the first's
    monkeypatch.setattr(compare.time, "strftime", lambda *a: "29990101T000000")
    first = compare.save_and_flag()
    second = compare.save_and_flag()
    printed = capsys.readouterr().out
    assert first.name == "29990101T000000-full.json" != second.name
    assert second.name == "29990101T000000.1-full.json" and first.exists()
    assert printed.count("compared with 29990101T000000-full.json") == 1


@pytest.fixture
def envs(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("_envs_acceptance", BENCH / "envs.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclass looks the module up
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "VENVS", tmp_path)
    monkeypatch.setattr(mod, "REUSE", {})
    return mod


def test_side_environments_pin_the_origin_tools_the_issue_names(envs):
    req = envs.REQUIREMENTS
    assert set(req["dolma"]) == {
        "dolma==1.2.1",
        "fsspec==2023.6.0",
        "s3fs==2023.6.0",
        "aiobotocore==2.5.4",
        "botocore==1.31.17",
        "boto3==1.28.17",
    }
    assert {"modalities==0.5.0", "transformers==4.57.6", "tokenizers==0.22.2"} <= set(
        req["modalities"]
    )
    torch = [r for r in req["modalities"] if "torch" in r]
    assert len(torch) == 1 and "torch-2.13.0" in torch[0] and torch[0].endswith(".whl")
    assert req["streaming"] == ("mosaicml-streaming==0.13.0",)
    assert req["zarr2"] == ("zarr>=2.18,<3",) and req["zarr3"] == ("zarr>=3,<4",)


def test_a_side_environment_is_made_once_and_a_failed_install_is_reported(envs, monkeypatch):
    calls: list[list[str]] = []

    class Done:
        def __init__(self, code: int) -> None:
            self.returncode, self.stdout, self.stderr = code, "", "pip: no such version\n"

    def create(self, path):
        (Path(path) / "bin").mkdir(parents=True)
        (Path(path) / "bin" / "python").write_text("")

    monkeypatch.setattr(envs.venv.EnvBuilder, "create", create)
    code = {"n": 0}
    monkeypatch.setattr(
        envs.subprocess, "run", lambda argv, **kw: calls.append(argv) or Done(code["n"])
    )
    first = envs.ensure("streaming", log=lambda *a, **k: None)
    assert first.ok and calls[-1][-1] == "mosaicml-streaming==0.13.0"
    again = envs.ensure("streaming", log=lambda *a, **k: None)
    assert again.python == first.python and len(calls) == 1  # reused: pip not run again
    code["n"] = 1
    bad = envs.ensure("zarr3", log=lambda *a, **k: None)
    assert not bad.ok and "no such version" in bad.error and len(calls) == 2
    still = envs.ensure("zarr3", log=lambda *a, **k: None)
    assert not still.ok and len(calls) == 2  # the failure is remembered, not retried each run
    monkeypatch.setitem(envs.REQUIREMENTS, "zarr3", ("zarr>=3.1,<4",))
    code["n"] = 0
    assert envs.ensure("zarr3", log=lambda *a, **k: None).ok and len(calls) == 3  # new pins


def _value(table: str, name: str, value: float, higher_is_better: bool = True) -> dict:
    return {"table": table, "name": name, "value": value, "higher_is_better": higher_is_better}


def test_recorded_values_of_module_tables_are_compared_with_the_last_run_that_had_them(
    compare, capsys
):
    # an older run measured the loader table; the latest run measured only the dolma table
    _saved(
        compare,
        "20000101T000000",
        [_row("side", "old row", 4.0, 1.0)],
        (_value("loader", "rows/s", 1000.0), _value("loader", "vs limit", 0.9)),
    )
    _saved(
        compare,
        "20000102T000000",
        [],
        (
            _value("dolma", "tag 1 proc docs/s", 20_000.0),
            _value("dolma", "tag 2 proc docs/s", 40_000.0),
            _value("dolma", "pause s", 1.0, higher_is_better=False),
            _value("dolma", "wait s", 1.0, higher_is_better=False),
        ),
    )
    _saved(compare, "29990101T000000", [], (_value("loader", "rows/s", 1.0),), mode="quick")
    (compare.RESULTS / "20000101T120000-full.json").write_text('{"rows": [')  # interrupted
    assert compare.record("loader", "rows/s", 850.0, unit="rows/s") == 850.0  # -15%
    compare.record("loader", "vs limit", 0.85)  # -5.6%: within the tolerance
    compare.record("dolma", "tag 1 proc docs/s", 21_000.0)  # faster
    compare.record("dolma", "tag 2 proc docs/s", 30_000.0)  # -25%
    compare.record("dolma", "pause s", 1.2, higher_is_better=False)  # +20%: worse
    compare.record("dolma", "wait s", 0.5, higher_is_better=False)  # better
    compare.record("dolma", "new value", 1.0)
    compare.compare("side", "old row", lambda: (1.0, 0), lambda: (3.0, 0), pairs=1)  # 4x -> 3x
    out = compare.save_and_flag()
    printed = capsys.readouterr().out
    assert "compared with 20000102T000000-full.json" in printed
    lines = sorted(x for x in printed.splitlines() if x.startswith("REGRESSION"))
    assert lines == [
        "REGRESSION: dolma / pause s: 1 -> 1.2 (+20%)",
        "REGRESSION: dolma / tag 2 proc docs/s: 40,000 -> 30,000 (-25%)",
        "REGRESSION: loader / rows/s: 1,000 -> 850 rows/s (-15%) (vs 20000101T000000-full.json)",
        "REGRESSION: side / old row: ratio 4.00x -> 3.00x (vs 20000101T000000-full.json)",
    ]
    saved = json.loads(out.read_text())
    assert {(v["table"], v["name"]) for v in saved["values"]} >= {("dolma", "new value")}
    assert saved["seconds"] == {}


def test_run_saves_each_modules_wall_time_and_quick_runs_named_modules(
    monkeypatch, tmp_path, capsys
):
    # `--quick NAME` runs a per-format module too (the lead checks modules end to end so);
    # a bare `--quick` runs only the side-by-side modules
    bench = tmp_path / "bench"
    bench.mkdir()
    for f in ("_compare.py", "run.py"):
        (bench / f).write_text((BENCH / f).read_text())
    (bench / "bench_own.py").write_text(
        "import _compare\n"
        "def main():\n"
        "    print('own table', _compare.record('own', 'rate', 5.0, unit='docs/s'))\n"
    )
    (bench / "bench_origin_x.py").write_text("def main():\n    print('origin x')\n")
    monkeypatch.setenv("LMDATA_BENCH_QUICK", "1")
    for argv, ran in (
        (["--quick", "bench_own"], {"bench_own"}),
        (["--quick"], {"bench_origin_x"}),
    ):
        spec = importlib.util.spec_from_file_location(f"_run_{len(argv)}", bench / "run.py")
        run = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run)
        monkeypatch.setattr(sys, "argv", ["run.py", *argv])
        monkeypatch.syspath_prepend(str(bench))
        sys.modules.pop("_compare", None)
        run.main()
        printed = capsys.readouterr().out
        got = {m for m in ("bench_own", "bench_origin_x") if f"=== {m} ===" in printed}
        assert got == ran and "wall time per module: " in printed
        newest = sorted((bench / "results").glob("*-quick.json"))[-1]
        saved = json.loads(newest.read_text())
        assert set(saved["seconds"]) == ran
        if "bench_own" in ran:
            assert saved["values"][0]["name"] == "rate" and saved["values"][0]["value"] == 5.0
    sys.modules.pop("_compare", None)


def test_a_value_recorded_in_a_child_process_reaches_the_parents_results(
    compare, monkeypatch, capsys
):
    # bench_parallel measures in a fresh interpreter: its record() calls must not be lost
    monkeypatch.setenv(compare.RELAY, "1")
    compare.record("par", "processes 1 -> 2 workers", 1.8, unit="x")
    child_out = capsys.readouterr().out
    monkeypatch.delenv(compare.RELAY)
    assert compare._VALUES == []  # the child keeps nothing itself
    lines = [*child_out.splitlines(), "an ordinary line"]
    shown = [line for line in lines if not compare.relayed(line)]
    assert shown == ["an ordinary line"]
    (v,) = compare._VALUES
    assert (v.table, v.name, v.value, v.higher_is_better, v.unit) == (
        "par",
        "processes 1 -> 2 workers",
        1.8,
        True,
        "x",
    )


@pytest.fixture
def reads(monkeypatch):
    """bench_origin_reads, loaded under its own name (its _compare and envs are dropped after)."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the module puts bench/ first
    name = "_origin_reads_acceptance"
    spec = importlib.util.spec_from_file_location(name, BENCH / "bench_origin_reads.py")
    mod = importlib.util.module_from_spec(spec)
    had = {k: sys.modules.get(k) for k in ("_compare", "envs", name)}
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod.C, "gc", types.SimpleNamespace(collect=lambda *args: 0))  # (above)
    yield mod
    for k, v in had.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v


def _flat_stores(tmp_path: Path, tokens, seq: int) -> dict[str, Path]:
    from lmdata.formats.flat_tokens import Writer

    stores = {}
    for kind, comp in (("uncompressed", None), ("seqax blosc", "blosc")):
        stores[kind] = tmp_path / f"{kind.replace(' ', '-')}-{tokens[5]}.zarr"
        with Writer(stores[kind], compression=comp, chunk_tokens=100) as w:
            for a in range(0, len(tokens), 37):  # sequences across chunk and row bounds
                w.write(tokens[a : a + 37])
    return stores


def test_zarr_python_reads_the_rows_lmdata_reads_and_a_missing_env_skips_its_rows(
    reads, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("zarr")  # the main venv's zarr-python stands in for a side venv's
    import numpy as np

    seq = 16
    tokens = np.random.default_rng(0).integers(1, 1000, 40 * seq + 5, dtype=np.uint32)
    # one store (a zarr worker each, seconds to start): the harness does the same per store
    stores = {"seqax blosc": _flat_stores(tmp_path, tokens, seq)["seqax blosc"]}
    batches = [np.random.default_rng(k).integers(0, 40, 4) for k in range(3)]
    envs = reads.envs
    here = envs.Env("zarr3", Path(sys.executable))
    missing = envs.Env("zarr2", None, "pip: no zarr 2 here")
    monkeypatch.setattr(envs, "ensure", lambda tool: here if tool == "zarr3" else missing)
    monkeypatch.setattr(reads, "SEQ_BLOCK", 7)  # 40 rows: blocks of 7, the last one short
    monkeypatch.setattr(reads.C, "PAIRS", 1)
    versions = reads.zarr_rows(tmp_path, stores, batches, 40, seq)
    import zarr

    assert versions == f"zarr-python 3 {zarr.__version__}"
    rows = {r.name: r for r in reads.C._ROWS if r.table == "flat-tokens"}
    for op in ("random", "sequential"):
        for kind in stores:
            ok, skipped = rows[f"zarr-python 3: {op}, {kind}"], rows[f"zarr-python 2: {op}, {kind}"]
            # equal digests: the pair counted (a differing pair leaves no ratio and says so)
            assert ok.pairs == 1 and ok.ratio is not None and ok.note == ""
            assert skipped.ratio is None and "zarr-python 2 not installed" in skipped.note
            assert "no zarr 2 here" in skipped.note and skipped.lmdata_s > 0
    assert "zarr-python 2 rows SKIPPED" in capsys.readouterr().out


def test_zarr_rows_of_other_tokens_do_not_count(reads, tmp_path):
    pytest.importorskip("zarr")
    import numpy as np

    import lmdata

    seq = 16
    tokens = np.random.default_rng(0).integers(1, 1000, 40 * seq, dtype=np.uint32)
    ours = _flat_stores(tmp_path, tokens, seq)["seqax blosc"]
    tokens[5] += 1  # one token differs
    theirs = _flat_stores(tmp_path, tokens, seq)["seqax blosc"]
    np.save(tmp_path / "b.npy", np.zeros((1, 4), dtype=np.int64))
    job = {"store": str(theirs), "batches": str(tmp_path / "b.npy"), "seq": seq}
    worker = reads.Worker(Path(sys.executable), "_zarr_worker.py", job)
    try:
        rows = lmdata.open(ours).packed_rows(np.arange(40), seq)
        row = reads.C.compare(
            "t",
            "other tokens",
            lambda: (1.0, reads.rows_digest([rows])),  # the digest does not see read blocks
            lambda: worker.run({"op": "seq", "rows": 40, "block": 7}),
            pairs=1,
        )
        assert row.ratio is None and "OUTPUTS DIFFER" in row.note
        same = lmdata.open(theirs).packed_rows(np.arange(40), seq)
        assert worker.run({"op": "seq", "rows": 40, "block": 7})[1] == reads.rows_digest([same])
    finally:
        worker.close()


def test_the_tokenize_limit_is_the_fastest_bare_call_and_counts_the_same_tokens(
    reads, tmp_path, monkeypatch
):
    tokenizers = pytest.importorskip("tokenizers")
    from lmdata.tokenize import load_tokenizer

    bt = reads._load("bench_tokenize")
    fast = bt.fastest_bare()
    has_fast = hasattr(tokenizers.Tokenizer, "encode_batch_fast")
    assert fast == ("encode_batch_fast" if has_fast else "encode_batch")
    monkeypatch.setattr(bt, "N_DOCS", 20)
    src = tmp_path / "docs.jsonl"
    bt.make_docs(src)
    texts = [json.loads(line)["text"] for line in src.read_text().splitlines()]
    want = sum(len(x) for x in load_tokenizer(str(bt.TOKENIZER)).encode_batch(texts))
    assert bt.bare(src, 1, fast)[1] == bt.bare(src, 1, "encode_batch")[1] == want
