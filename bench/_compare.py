"""Side-by-side timing of lmdata and an origin tool: interleaved pairs, outputs checked equal.

A row runs lmdata (A) and the other column (B) as A B A B ... on the same inputs, each run in a
fresh subprocess when start-up is part of what a user waits for. A pair counts only if both
outputs agree (bytes or decoded values); the ratio is the median over pairs of B's time over
A's (above 1: lmdata is faster). Results go to bench/results/*.json, and each row is compared
with the latest earlier results file of the same mode that has it: a row whose ratio fell is
flagged REGRESSION (printed, never failing the run). A bench module that prints its own table
(rates, scaling, ratios to a limit) hands each number to ``record`` too, so those rows are
compared the same way.
"""

from __future__ import annotations

import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
QUICK = os.environ.get("LMDATA_BENCH_QUICK") == "1"
PAIRS = 3 if QUICK else 7
# A row is flagged when its ratio fell by more than this fraction since the previous run.
TOLERANCE = 0.10

Run = Callable[[], tuple[float, Any]]  # returns (seconds, output to compare)


@dataclass
class Row:
    """One measured comparison; ratio = median(other_s / lmdata_s) over agreeing pairs."""

    table: str
    name: str
    lmdata_s: float = 0.0
    other_s: float = 0.0
    ratio: float | None = None
    pairs: int = 0
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)


_ROWS: list[Row] = []


@dataclass(frozen=True)
class Table:
    """What a printed table says about its other column, for the markdown report."""

    title: str
    other: str
    kind: str
    sizes: str
    unit: str = "s"


_TABLES: dict[str, Table] = {}
# docs block name -> markdown: a bench module's own tables (per-format rates, not pairs),
# given by the module (report) or, failing that, its printed output (module_output)
_OUTPUTS: dict[str, str] = {}
COMMAND = "make bench"  # how this run was started, for the report (bench/run.py sets it)
STARTED = time.time()  # when this run began, for the report
# bench module -> why it measured nothing (a shallow clone has no "before" tree, ...)
SKIPPED: dict[str, str] = {}


def skip(module: str, why: str) -> None:
    """Record that ``module`` measured nothing and why: printed now, named in the run header."""
    SKIPPED[module] = why
    print(f"{module} SKIPPED: {why}", flush=True)


@dataclass
class Value:
    """One number a bench module printed in its own table (a rate, a ratio, a time), kept so the
    next run of the same mode can flag it when it got worse."""

    table: str
    name: str
    value: float
    higher_is_better: bool = True
    unit: str = ""


_VALUES: list[Value] = []
# bench module -> its wall time in this run (saved, for planning a full run)
SECONDS: dict[str, float] = {}


def record(
    table: str, name: str, value: float, higher_is_better: bool = True, unit: str = ""
) -> float:
    """Keep one printed rate or ratio of a bench module's own table (``table`` names the table,
    ``name`` the row and column): saved with the run, and flagged REGRESSION when it is more
    than TOLERANCE worse than the last run of the same mode that recorded it. Returns ``value``,
    so a module can record where it prints."""
    got = Value(table, name, float(value), higher_is_better, unit)
    if os.environ.get(RELAY) == "1":  # measured in a child process: the parent records it
        print(_RELAY_MARK + json.dumps(asdict(got)), flush=True)
    else:
        _VALUES.append(got)
    return value


# A module that measures in a child process sets RELAY=1 in the child's environment and passes
# each line the child prints through relayed(): record() calls cross as marked lines.
RELAY = "LMDATA_BENCH_RELAY"
_RELAY_MARK = "@@lmdata-bench-record "


def relayed(line: str) -> bool:
    """True when ``line`` (a child's output, with RELAY=1 set for it) was a record() call, now
    recorded in this process; the caller prints every other line."""
    if not line.startswith(_RELAY_MARK):
        return False
    _VALUES.append(Value(**json.loads(line[len(_RELAY_MARK) :])))
    return True


def compare(
    table: str,
    name: str,
    lmdata: Run,
    other: Run | None,
    why: str = "",
    pairs: int | None = None,
    collect: bool = True,
) -> Row:
    """Time `lmdata` and `other` in interleaved pairs (``pairs``, default PAIRS, for rows whose
    runs are long); a pair whose outputs differ is dropped.

    Each run starts from the same cyclic-collector state (``collect``, the default: a
    ``gc.collect()`` before each call, outside the time the run measures). A full collection
    runs when the objects made since the last one reach a quarter of those it kept, so without
    it the rows run before decide which side's run gets an extra pass over the objects it
    holds: an in-process row keeping ~800,000 objects measured 0.88x or 1.17x by that alone.
    ``collect=False``: a row whose runs should see the collector as a long job does."""
    row = Row(table, name)
    n = PAIRS if pairs is None else max(1, min(pairs, PAIRS))
    _ROWS.append(row)

    def call(run: Run) -> tuple[float, Any]:
        if collect:
            gc.collect()
        return run()

    if other is None:
        row.note = why or "other column unavailable"
        times = [call(lmdata)[0] for _ in range(max(1, n // 2))]
        row.lmdata_s = statistics.median(times)
        return row
    ta, tb, ratios, bad = [], [], [], 0
    for _ in range(n):
        sa, out_a = call(lmdata)
        sb, out_b = call(other)
        if out_a != out_b:
            bad += 1
            continue
        ta.append(sa)
        tb.append(sb)
        ratios.append(sb / sa)
    if not ratios:
        row.note = f"OUTPUTS DIFFER in all {bad} pairs: no time counted"
        return row
    row.lmdata_s, row.other_s = statistics.median(ta), statistics.median(tb)
    row.ratio, row.pairs = statistics.median(ratios), len(ratios)
    if bad:
        row.note = f"outputs differed in {bad} pairs (dropped)"
    return row


def interleaved(
    fns: dict[str, Callable[[int], int]], rounds: int = 15, seconds: float = 0.2
) -> dict[str, tuple[float, float]]:
    """In-process throughput, for the benches that report rows/s rather than pairs:
    (items/s, 10th-percentile seconds per call) of each ``fn(i)`` (returning the items it
    handled): rounds of ``seconds`` each, the paths taking turns, the median round per path.
    Every path gets the same ``i`` sequence, so paths indexing by ``i`` see the same rows."""
    import numpy as np

    got: dict[str, list[float]] = {k: [] for k in fns}
    calls: dict[str, list[float]] = {k: [] for k in fns}
    start = 0
    for _ in range(rounds):
        for name, fn in fns.items():
            i, n, t0 = start, 0, time.perf_counter()
            t = t0
            while t - t0 < seconds:
                n += fn(i)
                i += 1
                t1 = time.perf_counter()
                calls[name].append(t1 - t)
                t = t1
            got[name].append(n / (t - t0))
        start = i
    return {k: (statistics.median(v), float(np.percentile(calls[k], 10))) for k, v in got.items()}


def timed_cmd(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> float:
    """Wall time of one command in a fresh process; a failure raises with its stderr tail."""
    full = {**os.environ, **(env or {})}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=full, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{tail}")
    return dt


def lmdata_cmd(*args: str) -> list[str]:
    """This checkout's lmdata CLI (the worktree's package, not an installed one)."""
    return [sys.executable, "-m", "lmdata.cli", *args]


LMDATA_ENV = {"PYTHONPATH": str(ROOT)}


def print_table(table: str, title: str, other: str, kind: str, sizes: str, unit: str = "s") -> None:
    """Print one table: which column is the origin tool or a re-implementation, and the sizes."""
    _TABLES[table] = Table(title, other, kind, sizes, unit)
    rows = [r for r in _ROWS if r.table == table]
    print(f"\n{title}\n  other column: {other} [{kind}]\n  sizes: {sizes}")
    n = _most_pairs(table)
    print(f"  pairs: interleaved, median of up to {n}; ratio = other time / lmdata time")
    print(f"  {'row':46s}{'lmdata ' + unit:>12s}{'other ' + unit:>12s}{'ratio':>9s}  note")
    for r in rows:
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        other_s = f"{r.other_s:.3f}" if r.other_s else "-"
        extra = "; ".join(f"{k} {v:,.3g}" for k, v in r.extra.items())
        note = "; ".join(x for x in (r.note, extra) if x)
        print(f"  {r.name:46s}{r.lmdata_s:12.3f}{other_s:>12s}{ratio:>9s}  {note}")


def _most_pairs(table: str) -> int:
    """The most pairs a row of ``table`` counted (PAIRS when none was compared)."""
    return max((r.pairs for r in _ROWS if r.table == table), default=0) or PAIRS


def markdown(table: str) -> str:
    """One printed table as markdown: what the other column is, the sizes, then the rows."""
    t = _TABLES[table]
    lines = [
        f"*{t.title}.* Other column: {t.other} (**{t.kind}**). Sizes: {t.sizes}. "
        f"Ratio = other time / lmdata time, median of up to {_most_pairs(table)} interleaved pairs "
        "whose outputs agree (above 1: lmdata is faster).",
        "",
        f"| row | lmdata {t.unit} | other {t.unit} | ratio | note |",
        "|---|---:|---:|---:|---|",
    ]
    for r in _ROWS:
        if r.table != table:
            continue
        ratio = f"**{r.ratio:.2f}x**" if r.ratio is not None else "-"
        other_s = f"{r.other_s:.3f}" if r.other_s else "-"
        extra = "; ".join(f"{k} {v:,.3g}" for k, v in r.extra.items())
        note = "; ".join(x for x in (r.note, extra) if x).replace("|", "/")
        lines.append(f"| {r.name} | {r.lmdata_s:.3f} | {other_s} | {ratio} | {note} |")
    return "\n".join(lines)


def report(block: str, text: str) -> None:
    """A bench module's own markdown (its per-format table), for the docs block ``block``."""
    _OUTPUTS[block] = text.strip()


def module_output(block: str, command: str, printed: str) -> None:
    """What a bench module printed, as the docs block ``block`` (a fenced copy, since modules
    print fixed-width tables), unless the module gave its own markdown through report()."""
    if block in _OUTPUTS or not printed.strip():
        return
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    fence = "~~~~" if "```" in printed else "```"
    _OUTPUTS[block] = (
        f"Output of `{command}` in this run (load average at its end {load}, 1 / 5 / 15 min):"
        f"\n\n{fence}text\n{printed.strip()}\n{fence}"
    )


def run_header() -> str:
    """When, on what commit and under what load the run was taken (for the report)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        commit = "?"
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    start, end = (time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) for t in (STARTED, time.time()))
    when = start if start == end else f"{start}-{end[11:] if end[:10] == start[:10] else end}"
    skipped = "".join(f" Skipped {m}: {why}." for m, why in SKIPPED.items())
    return (
        f"`{COMMAND}` run of {when} UTC, commit {commit or '?'}, {os.cpu_count()} CPUs, "
        f"load average at the end {load} (1 / 5 / 15 min).{skipped}"
    )


def save_and_flag() -> Path:
    """Write this run's rows and recorded values as JSON and markdown; flag every row and
    value worse than in the latest earlier results file of the same mode that has it (a run of
    a few modules still compares each table with the last run that measured it)."""
    RESULTS.mkdir(exist_ok=True)
    mode = "quick" if QUICK else "full"
    previous = sorted(RESULTS.glob(f"*-{mode}.json"))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = RESULTS / f"{stamp}-{mode}.json"
    k = 1
    while out.exists():  # a run in the same second: never overwrite (nor compare with) it
        out, k = RESULTS / f"{stamp}.{k}-{mode}.json", k + 1
    saved = {
        "mode": mode,
        "rows": [asdict(r) for r in _ROWS],
        "values": [asdict(v) for v in _VALUES],
        "seconds": SECONDS,
    }
    out.write_text(json.dumps(saved, indent=1))
    report = [run_header(), *(markdown(t) for t in _TABLES), *_OUTPUTS.values()]
    out.with_suffix(".md").write_text("\n\n".join(report) + "\n")
    print(f"\nresults: {out.relative_to(ROOT)} (markdown: {out.with_suffix('.md').name})")
    rows, values, read = _latest(previous)
    unread = [f.name for f in previous if f.name not in read]
    if unread:
        print(f"skipped unreadable results files: {', '.join(unread)}")
    if not read:
        print("no previous results file to compare with")
        return out
    newest = read[-1]
    print(f"compared with {newest} (a row it lacks: with the latest earlier run of it):")
    flagged = [*_row_regressions(rows, newest), *_value_regressions(values, newest)]
    for line in flagged:
        print(f"REGRESSION: {line}")
    if not flagged:
        print(f"no row got slower by more than {TOLERANCE:.0%}")
    return out


def _latest(
    files: list[Path],
) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], Any], list[str]]:
    """(table, name) -> the newest saved row and recorded value among ``files`` (oldest first),
    and the names of the files read; an unreadable file is skipped (an interrupted run may have
    left half of one)."""
    rows: dict[tuple[str, str], Any] = {}
    values: dict[tuple[str, str], Any] = {}
    read: list[str] = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        read.append(f.name)
        for r in data.get("rows", []):
            rows[(r["table"], r["name"])] = {**r, "file": f.name}
        for v in data.get("values", []):
            values[(v["table"], v["name"])] = {**v, "file": f.name}
    return rows, values, read


def _since(old: dict[str, Any], newest: str) -> str:
    return "" if old["file"] == newest else f" (vs {old['file']})"


def _row_regressions(before: dict[tuple[str, str], Any], newest: str) -> list[str]:
    """Side-by-side rows whose ratio fell (or, with no other column, whose time rose) by more
    than TOLERANCE."""
    lines = []
    for r in _ROWS:
        old = before.get((r.table, r.name))
        if old is None:
            continue
        if old["ratio"] and r.ratio and r.ratio < old["ratio"] * (1 - TOLERANCE):
            what = f"ratio {old['ratio']:.2f}x -> {r.ratio:.2f}x"
        elif (
            old["ratio"] is None
            and old["lmdata_s"]
            and r.lmdata_s > old["lmdata_s"] * (1 + TOLERANCE)
        ):
            what = f"time {old['lmdata_s']:.3f} s -> {r.lmdata_s:.3f} s"
        else:
            continue
        lines.append(f"{r.table} / {r.name}: {what}{_since(old, newest)}")
    return lines


def _value_regressions(before: dict[tuple[str, str], Any], newest: str) -> list[str]:
    """Recorded values (record()) worse by more than TOLERANCE: lower when higher is better,
    higher otherwise."""
    lines = []
    for v in _VALUES:
        old = before.get((v.table, v.name))
        if old is None or not old["value"] or not v.value:
            continue
        if old["higher_is_better"] != v.higher_is_better:
            continue  # the value changed meaning: nothing to compare with
        if v.higher_is_better:
            worse = v.value < old["value"] * (1 - TOLERANCE)
        else:
            worse = v.value > old["value"] * (1 + TOLERANCE)
        if worse:
            change = v.value / old["value"] - 1
            what = f"{_num(old['value'])} -> {_num(v.value)} {v.unit} ({change:+.0%})".replace(
                "  ", " "
            )
            lines.append(f"{v.table} / {v.name}: {what}{_since(old, newest)}")
    return lines


def _num(x: float) -> str:
    """A value as a table prints it: ratios with two decimals, rates with thousands commas."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


MARK = "<!-- bench:{} -->"
END = "<!-- /bench:{} -->"
_TABLES_MARKS = (" Tables: ", " Tables of this run: ")  # the second: headers before the merge


def merge_runs(old: str, header: str, tables: list[str]) -> str:
    """The ``bench:run`` block: one line per run whose tables are still in the docs, this
    run's first. A table measured now leaves its older run's line; a line left with no table
    goes, as does a line that names no tables (it cannot be attributed)."""
    fresh = set(tables)
    lines = [f"- {header} Tables: {', '.join(tables) or 'none'}."]
    for line in old.splitlines():
        text = line.strip().removeprefix("- ")
        found = [(text.rfind(m), m) for m in _TABLES_MARKS if m in text]
        if not found:
            continue
        k, mark = max(found)
        rest = text[k + len(mark) :]
        cut = rest.find(";")
        names = rest[:cut] if cut >= 0 else rest.rstrip().removesuffix(".")
        kept = [n for n in (x.strip() for x in names.split(",")) if n and n not in fresh]
        if kept and kept != ["none"]:
            tail = rest[len(names) :] if cut >= 0 else "."
            lines.append(f"- {text[:k]} Tables: {', '.join(kept)}{tail}")
    return "\n".join(lines)


def _block(text: str, name: str) -> tuple[int, int] | None:
    """Where block ``name``'s body starts and ends in ``text`` (markers on lines of their own:
    prose that quotes a marker is not a block)."""
    start, end = MARK.format(name), END.format(name)
    i = text.find(f"\n{start}\n")
    j = text.find(f"\n{end}", i + 1) if i >= 0 else -1
    return None if i < 0 or j < 0 else (i + 1 + len(start) + 1, j)


DOCS = ROOT / "docs"  # the pages whose generated blocks a run rewrites (docs/benchmarks/ ...)
README = ROOT / "README.md"  # holds the summary block, one line per side-by-side table
_SIDE = re.compile(
    r"\*(?P<title>.+?)\.?\* Other column: (?P<other>.+?) \(\*\*(?P<kind>[^*]+)\*\*\)\."
)
_RATIO = re.compile(r"\| \*\*(\d+(?:\.\d+)?)x\*\* \|")


def update_docs(pages: list[Path] | None = None, readme: Path | None = README) -> list[str]:
    """Replace each `<!-- bench:TABLE -->` ... `<!-- /bench:TABLE -->` block of the docs pages
    (every ``docs/**/*.md`` by default) with this run's markdown of TABLE (a side-by-side table,
    or a bench module's own tables under its module name), merge this run's header into the
    block `bench:run` (merge_runs), so the pages say which run measured each table, and then
    rewrite the README's `bench:summary` block from the side-by-side tables the pages now hold
    (summary). Tables not measured in this run keep their previous text; returns the names of
    the blocks replaced."""
    pages = sorted(DOCS.rglob("*.md")) if pages is None else pages
    # a marker on the first line is on a line of its own
    texts = {page: "\n" + page.read_text() for page in pages}
    tables = [*_TABLES, *_OUTPUTS]
    blocks = {**{t: markdown(t) for t in _TABLES}, **_OUTPUTS}
    for text in texts.values():
        run = _block(text, "run")
        if run:
            blocks = {"run": merge_runs(text[run[0] : run[1]], run_header(), tables), **blocks}
            break
    done = []
    for name, body in blocks.items():
        for page, text in texts.items():
            where = _block(text, name)
            if where is None:
                continue
            texts[page] = text[: where[0]] + body + text[where[1] :]
            if name not in done:
                done.append(name)
    for page, text in texts.items():
        if text[1:] != page.read_text():
            page.write_text(text[1:])
    if readme is not None and readme.exists():
        text = "\n" + readme.read_text()
        where = _block(text, "summary")
        if where is not None:
            body = summary(list(texts.values()))
            readme.write_text((text[: where[0]] + body + text[where[1] :])[1:])
            done.append("summary")
    return done


def summary(pages: list[str]) -> str:
    """One line per side-by-side table found in ``pages`` (their text): its title, its other
    column and the range of its ratios (above 1: lmdata is faster), for the README."""
    lines = [
        "| table | what | other column | lmdata's speed: other time / lmdata time |",
        "|---|---|---|---|",
    ]
    for text in pages:
        for m in re.finditer(r"\n<!-- bench:([\w-]+) -->\n", text):
            where = _block(text, m.group(1))
            body = text[where[0] : where[1]] if where else ""
            head = _SIDE.match(body)
            ratios = sorted(float(r) for r in _RATIO.findall(body))
            if head is None or not ratios:
                continue
            span = f"{ratios[0]:.2f}x to {ratios[-1]:.2f}x ({len(ratios)} rows)"
            if ratios[0] == ratios[-1]:
                span = f"{ratios[0]:.2f}x"
            other = head["other"].split(" (")[0]  # its parenthesised details stay on the page
            other = f"{other} ({head['kind']})".replace("|", "/")
            title = head["title"].replace("*", "\\*")  # r*2048 is not emphasis
            lines.append(f"| `{m.group(1)}` | {title} | {other} | {span} |")
    return "\n".join(lines)
