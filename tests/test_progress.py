"""One progress event for every long verb: frozen :class:`lmdata.Progress` events, monotonic
within a phase, from tokenize, convert, stats, index, manifest and the Dolma toolkit alike;
the library itself draws nothing (only ``lmdata/cli/`` imports tqdm or the drawing module)."""

from __future__ import annotations

import ast
import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata import Progress
from lmdata._progress import Counter, Ticker, accepted, relabelled

ROOT = Path(lmdata.__file__).parent
DOLMA = Path(__file__).parent / "data" / "dolma"


class Events(list):
    """Records the events a verb sends, checking each is a frozen Progress."""

    def __call__(self, e: Progress) -> None:
        assert type(e) is Progress, e
        with pytest.raises(dataclasses.FrozenInstanceError):
            e.done = 0  # type: ignore[misc]
        self.append(e)

    def phases(self) -> dict[tuple[str, str], list[Progress]]:
        """Events by (what, unit), each checked: never backwards, never past the total."""
        out: dict[tuple[str, str], list[Progress]] = {}
        for e in self:
            out.setdefault((e.what, e.unit), []).append(e)
        for key, events in out.items():
            dones = [e.done for e in events]
            assert dones == sorted(dones), (key, dones)
            assert all(e.total is None or 0 <= e.done <= e.total for e in events), (key, events)
        return out


def test_a_ticker_announces_its_total_and_never_goes_back_or_past_it() -> None:
    got = Events()
    t = Ticker(got, 10, "validate")
    t.add(4)
    t.to(2)  # behind what was reported: nothing
    t.add(100)  # past the total: clamped
    t.finish()  # already there: nothing more
    assert [(e.done, e.total) for e in got] == [(0, 10), (4, 10), (10, 10)]
    assert {(e.unit, e.what) for e in got} == {("bytes", "validate")}
    assert got[1].fraction == 0.4 and Progress(3, None, "tokens", "x").fraction is None
    Ticker(None, 5, "x").finish()  # nobody listens: nothing to call


def test_a_counter_reports_running_counts_of_an_unknown_total() -> None:
    got = Events()
    c = Counter(got, "tag")
    for n in (3, 0, -1, 2):
        c.add(n)
    assert got == [Progress(3, None, "documents", "tag"), Progress(5, None, "documents", "tag")]


def test_relabelled_moves_a_later_part_of_a_phase_on() -> None:
    got = Events()
    later = relabelled(got, "validate", by=100, total=150)
    assert later is not None and relabelled(None, "x") is None
    later(Progress(0, 50, "bytes", "hash"))
    later(Progress(50, 50, "bytes", "hash"))
    assert got == [Progress(100, 150, "bytes", "validate"), Progress(150, 150, "bytes", "validate")]


def test_a_bool_progress_is_deprecated_and_anything_else_refused() -> None:
    with pytest.warns(DeprecationWarning, match="lmdata.Progress"):
        assert accepted(True) is None
    f = print
    assert accepted(f) is f and accepted(None) is None
    with pytest.raises(lmdata.errors.InvalidInputError, match="takes a callable"):
        accepted(3)  # type: ignore[arg-type]


def test_the_library_draws_no_bar() -> None:
    """tqdm and the drawing module are the CLI's: no module outside lmdata/cli/ imports them."""
    drawing = {"tqdm", "lmdata.cli._progress"}
    found = []
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n in drawing]
            found += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] == "tqdm" and n not in drawing
            ]
    assert found == []


def test_every_progress_parameter_takes_the_one_event() -> None:
    """Every parameter named ``progress`` in the library is annotated with OnProgress (the
    Dolma verbs' old bool is accepted by :func:`accepted` only, with a warning)."""
    odd = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in node.args.args + node.args.kwonlyargs:
                    if a.arg == "progress" and a.annotation is not None:
                        shape = ast.unparse(a.annotation)
                        if shape not in ("OnProgress | None", "OnProgress | bool | None"):
                            odd.append(f"{path.relative_to(ROOT)}:{node.lineno} {shape}")
    assert odd == []


# ---- the verbs --------------------------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    docs = [{"id": f"d{i}", "text": "w " * (1 + i % 30)} for i in range(300)]
    (d / "a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in docs))
    return d


def test_tokenize_reports_bytes_then_documents_and_tokens(corpus: Path, tmp_path: Path) -> None:
    got = Events()
    s = lmdata.tokenize(corpus, tmp_path / "out", engine="inprocess", progress=got)
    phases = got.phases()
    assert set(phases) == {("tokenize", "bytes"), ("tokenize", "documents"), ("tokenize", "tokens")}
    size = (corpus / "a.jsonl").stat().st_size
    assert phases["tokenize", "bytes"][0] == Progress(0, size, "bytes", "tokenize")
    assert phases["tokenize", "bytes"][-1].done == size
    assert phases["tokenize", "documents"][-1].done == s.documents_read == 300
    assert phases["tokenize", "tokens"][-1].done == s.tokens
    assert got[0].unit == "bytes"  # the unit with the total comes first: the CLI's bar


def test_convert_reports_records_of_the_sources_total(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(50)))
    got = Events()
    from lmdata.convert import convert

    convert(src, tmp_path / "out", "mds", engine="inprocess", progress=got)
    (events,) = got.phases().values()
    assert events[0] == Progress(0, 50, "records", "convert")
    assert events[-1] == Progress(50, 50, "records", "convert")


def test_stats_and_index_report_their_phases(tmp_path: Path) -> None:
    from lmdata.formats.modalities_jsonl import build_index
    from lmdata.inspect.stats import compute

    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": "x" * i}) + "\n" for i in range(40)))
    got = Events()
    build_index(path, progress=got)
    assert got[0] == Progress(0, path.stat().st_size, "bytes", "index")
    assert got[-1].done == path.stat().st_size
    got = Events()
    compute(path, progress=got)
    assert got[-1] == Progress(40, 40, "records", "stats")


def test_manifest_reports_validation_then_hashing_as_one_walk(tmp_path: Path) -> None:
    path = tmp_path / "p.pbin"
    with lmdata.writer(path, "modalities") as w:
        for i in range(5):
            w.write(np.arange(1 + i, dtype=np.uint32))
    from lmdata._api import check_manifest, write_manifest

    got = Events()
    write_manifest(path, progress=got, overwrite=True)
    (events,) = got.phases().values()
    assert events[0].what == "manifest" and events[-1].done == events[-1].total
    got = Events()
    check_manifest(path, progress=got)
    (events,) = got.phases().values()
    assert events[-1].what == "manifest --check" and events[-1].done == events[-1].total


def _tree(tmp_path: Path) -> Path:
    docs = tmp_path / "t" / "documents"
    docs.mkdir(parents=True)
    rows = [{"id": f"d{i}", "text": "a b\nc d" if i % 3 else f"e {i}"} for i in range(60)]
    (docs / "p.jsonl.gz").write_bytes(
        gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    )
    return docs


def test_the_dolma_toolkit_reports_documents_per_phase(tmp_path: Path) -> None:
    from lmdata.dolma.config import DedupeConfig, MixerConfig, TagConfig
    from lmdata.dolma.dedupe import dedupe
    from lmdata.dolma.mixer import mix
    from lmdata.dolma.tag import tag

    docs = _tree(tmp_path)
    files = [str(docs / "*.gz")]
    got = Events()
    tag(TagConfig.from_dict({"documents": files, "taggers": ["char_length_v1"]}), got)
    assert got.phases()["tag", "documents"][-1].done == 60
    got = Events()
    cfg = {"name": "d", "paragraphs": {"attribute_name": "p"}}
    dedupe(DedupeConfig.from_dict({"documents": files, "dedupe": cfg}), got, engine="inprocess")
    assert got.phases()["dedupe: hash", "documents"][-1].done == 60
    got = Events()
    stream = {
        "name": "s",
        "documents": files,
        "output": {"path": str(tmp_path / "mixed"), "max_size_in_bytes": 1 << 20},
        "filter": {"exclude": ["$.metadata[?(@.drop > 0.5)]"]},
    }
    mix(MixerConfig.from_dict({"streams": [stream]}), progress=got, engine="inprocess")
    assert got.phases()["mix", "documents"][-1].done == 60
