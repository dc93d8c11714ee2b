"""Acceptance checks of issue 16's harness that no other test pinned: pairs run interleaved,
the ratio is the median of the agreeing pairs' ratios, and a row slower than in the previous
run of the same mode is flagged REGRESSION."""

from __future__ import annotations

import importlib.util
import json
import sys
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


def _previous(compare, rows: list[dict], mode: str = "full") -> None:
    compare.RESULTS.mkdir(parents=True, exist_ok=True)
    old = {"mode": mode, "rows": rows}
    (compare.RESULTS / f"20000101T000000-{mode}.json").write_text(json.dumps(old))


def _row(table: str, name: str, ratio: float | None, lmdata_s: float) -> dict:
    return {"table": table, "name": name, "ratio": ratio, "lmdata_s": lmdata_s}


def test_a_row_slower_than_in_the_previous_run_is_flagged(compare, capsys):
    _previous(
        compare,
        [
            _row("t", "fell", 3.0, 1.0),
            _row("t", "held", 3.0, 1.0),
            _row("t", "own", None, 1.0),  # a row with no other column: its own time counts
            _row("t", "own ok", None, 1.0),
        ],
    )
    _previous(compare, [_row("t", "fell", 100.0, 1.0)], mode="quick")  # another mode: ignored
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
    _previous(compare, [_row("t", "row", 2.1, 1.0)])  # 2.1x then, 2.0x now: within 10%
    compare.save_and_flag()
    printed = capsys.readouterr().out
    assert "REGRESSION" not in printed and "no row got slower by more than 10%" in printed


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
