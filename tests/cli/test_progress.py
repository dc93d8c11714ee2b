"""The CLI draws progress: plain lines (stderr not a terminal), the choice between bar, lines
and nothing, and events drawn as a bar per phase."""

from __future__ import annotations

import io

from lmdata import Progress
from lmdata.cli import _progress
from lmdata.cli._progress import LogLines


def test_lines_carry_amount_rate_eta_and_postfix():
    out = io.StringIO()
    p = LogLines(total=1000, unit="docs", desc="tokenize", file=out, interval=0)
    p.update(250)
    p.set_postfix_str("5 docs, 70 tokens")
    p.update(250)
    p.close()
    p.close()  # once only
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("tokenize: 250 docs of 1,000 docs (25%), ")
    assert "docs/s, ETA 0:" in lines[0]
    assert lines[1].startswith("tokenize: 500 docs of 1,000 docs (50%)")
    assert lines[1].endswith(" | 5 docs, 70 tokens")
    assert lines[2].startswith("tokenize: done, 500 docs in 0:00:00")
    assert len(lines) == 3


def test_lines_are_spaced_by_the_interval_and_scale_units():
    out = io.StringIO()
    p = LogLines(unit="B", unit_scale=True, file=out, interval=3600)
    for _ in range(100):
        p.update(12_345)
    p.close()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]]  # only the final one
    assert "done, 1.2 MB in" in out.getvalue()


def test_bar_picks_lines_off_a_terminal_and_nothing_when_quiet(monkeypatch):
    monkeypatch.setattr(_progress.sys, "stderr", io.StringIO())
    assert isinstance(_progress.bar(desc="x"), LogLines)
    quiet = _progress.bar(desc="x", quiet=True)
    assert not isinstance(quiet, LogLines) and quiet.disable
    monkeypatch.setenv("LMDATA_PROGRESS_INTERVAL", "7")
    assert _progress.bar()._interval == 7.0


def test_events_draw_a_bar_per_phase_with_other_units_beside_it(monkeypatch):
    """One bar per ``what`` (the previous one closed when the next phase starts); the first
    unit of a phase is the bar, the others (tokenize's documents, tokens) counts after it."""
    out = io.StringIO()
    monkeypatch.setattr(_progress.sys, "stderr", out)
    monkeypatch.setenv("LMDATA_PROGRESS_INTERVAL", "0")
    with _progress.shown() as progress:
        assert progress is not None
        progress(Progress(0, 2000, "bytes", "tokenize"))
        progress(Progress(1000, 2000, "bytes", "tokenize"))
        progress(Progress(7, None, "documents", "tokenize"))
        progress(Progress(2000, 2000, "bytes", "tokenize"))
        progress(Progress(5, None, "documents", "dedupe: hash"))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("tokenize: 0 B of 2.0 kB (0%)"), lines
    assert lines[1].startswith("tokenize: 1.0 kB of 2.0 kB (50%)"), lines
    assert lines[2].startswith("tokenize: 2.0 kB of 2.0 kB (100%)"), lines
    assert "| 7 documents (" in lines[2]
    assert lines[3].startswith("tokenize: done, 2.0 kB in "), lines
    assert lines[4].startswith("dedupe: hash: 5 docs")
    assert lines[5].startswith("dedupe: hash: done, 5 docs in "), lines
    assert len(lines) == 6


def test_quiet_gives_no_callable_and_draws_nothing(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(_progress.sys, "stderr", out)
    with _progress.shown(quiet=True) as progress:
        assert progress is None
    assert out.getvalue() == ""
