"""``validate`` on Dolma trees: every kind of failure, reported with file:line."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from lmdata._report import MAX_REPORTED, overflow_line
from lmdata.cli.main import cli
from lmdata.formats import dolma

DATA = Path(__file__).parent.parent / "data" / "dolma" / "dataset"
GOOD = {"id": "a", "text": "hello\n", "source": "s", "added": "2024", "metadata": {"u": 1}}


def _tree(
    tmp_path: Path, docs: list, attrs: dict[str, list] | None = None, raw: bytes | None = None
) -> Path:
    root = tmp_path / "t"
    (root / "documents").mkdir(parents=True)
    body = raw if raw is not None else b"".join(orjson.dumps(d) + b"\n" for d in docs)
    (root / "documents" / "p.jsonl.gz").write_bytes(gzip.compress(body))
    for name, rows in (attrs or {}).items():
        (root / "attributes" / name).mkdir(parents=True)
        (root / "attributes" / name / "p.jsonl.gz").write_bytes(
            gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        )
    return root


def _one(problems: list[str], *needles: str) -> str:
    hits = [p for p in problems if all(n in p for n in needles)]
    assert len(hits) == 1, problems
    return hits[0]


def test_fixture_is_valid() -> None:
    assert dolma.validate(DATA) == []


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({"id": "a", "text": "x"}, "missing mandatory field 'source'"),
        ({"text": "x", "source": "s"}, "missing mandatory field 'id'"),
        ({"id": "a", "source": "s"}, "missing mandatory field 'text'"),
        ({"id": 5, "text": "x", "source": "s"}, "'id' must be a string, got integer"),
        ({"id": "a", "text": ["x"], "source": "s"}, "'text' must be a string, got array"),
        ({"id": "a", "text": "x", "source": None}, "'source' must be a string, got null"),
        ({"id": "a", "text": "x", "source": "s", "added": 3}, "'added' must be a string"),
        ({"id": "a", "text": "x", "source": "s", "created": {}}, "'created' must be a string"),
        ({"id": "a", "text": "x", "source": "s", "metadata": []}, "'metadata' must be an object"),
        (
            {"id": "a", "text": "x", "source": "s", "attributes": 1},
            "'attributes' must be an object",
        ),
    ],
)
def test_document_field_rules(tmp_path: Path, doc: dict, needle: str) -> None:
    root = _tree(tmp_path, [GOOD, doc])
    p = _one(dolma.validate(root), needle)
    assert p.startswith(f"{root}/documents/p.jsonl.gz:2: ")


def test_bad_json_and_non_objects(tmp_path: Path) -> None:
    root = _tree(tmp_path, [], raw=b'{"id": "a", "text": "x", "source": "s"}\n{oops\n[1]\n\n')
    probs = dolma.validate(root)
    assert ":2: invalid JSON" in _one(probs, ":2:")
    assert "a JSON array where an object was expected" in _one(probs, ":3:")
    assert "empty line" in _one(probs, ":4:")


def test_ids_unique_within_a_source_only(tmp_path: Path) -> None:
    docs = [GOOD, {**GOOD, "source": "other"}, {**GOOD, "text": "again"}]
    p = _one(dolma.validate(_tree(tmp_path, docs)), "already used")
    assert "p.jsonl.gz:3:" in p and "p.jsonl.gz:1" in p and "'s'" in p


def test_attribute_rows_must_line_up(tmp_path: Path) -> None:
    docs = [GOOD, {**GOOD, "id": "b"}, {**GOOD, "id": "c"}]
    attrs = {
        "short": [{"id": "a", "attributes": {}}],
        "swapped": [
            {"id": "b", "attributes": {}},
            {"id": "a", "attributes": {}},
            {"id": "c", "attributes": {}},
        ],
        "noobj": [{"id": "a"}, {"id": "b", "attributes": []}, {"id": "c", "attributes": {}}],
    }
    probs = dolma.validate(_tree(tmp_path, docs, attrs))
    assert "1 rows for the 3 documents" in _one(probs, "attributes/short/p.jsonl.gz")
    assert "id 'b' does not match the document id 'a'" in _one(probs, "swapped/p.jsonl.gz:1")
    _one(probs, "swapped/p.jsonl.gz:2", "does not match")
    assert "needs an 'attributes' object, got null" in _one(probs, "noobj/p.jsonl.gz:1")
    assert "got array" in _one(probs, "noobj/p.jsonl.gz:2")


@pytest.mark.parametrize(
    "value, needle",
    [
        ([[3, 1, 1.0]], "0 <= start <= end, got [3, 1]"),
        ([[-1, 1, 1.0]], "0 <= start <= end"),
        ([[0, 1]], "expected [start, end, score]"),
        ([5], "expected [start, end, score]"),
        ([[0, 1.5, 1.0]], "must be integers"),
        ([[0, 1, "high"]], "score must be a number"),
    ],
)
def test_span_rules(tmp_path: Path, value: list, needle: str) -> None:
    attrs = {
        "exp": [{"id": "a", "attributes": {"exp__t__k": value, "ok": [[0, 6, 1]], "scalar": 0.5}}]
    }
    p = _one(dolma.validate(_tree(tmp_path, [GOOD], attrs)), needle)
    assert "attributes/exp/p.jsonl.gz:1: attribute 'exp__t__k' span 0" in p


def test_missing_and_orphan_attribute_files(tmp_path: Path) -> None:
    root = _tree(tmp_path, [GOOD], {"exp": [{"id": "a", "attributes": {}}]})
    shutil.copy(
        root / "attributes" / "exp" / "p.jsonl.gz", root / "attributes" / "exp" / "q.jsonl.gz"
    )
    (root / "attributes" / "empty").mkdir()
    probs = dolma.validate(root)
    assert "no document file documents/q.jsonl.gz" in _one(probs, "q.jsonl.gz")
    assert "attribute set 'empty' has no file" in _one(probs, "attributes/empty/p.jsonl.gz")


def test_many_problems_are_capped_and_counted(tmp_path: Path) -> None:
    docs = [{"id": str(i), "text": "x"} for i in range(120)]
    probs = dolma.validate(_tree(tmp_path, docs))
    assert len(probs) == MAX_REPORTED + 1
    assert probs[-1] == overflow_line("missing-source", 120 - MAX_REPORTED)
    assert all("missing mandatory field 'source'" in p for p in probs[:-1])


def test_cli_reports_places_and_exits_1(tmp_path: Path) -> None:
    root = _tree(tmp_path, [GOOD, {"id": "b", "text": "x"}])
    res = CliRunner().invoke(cli, ["validate", str(root), "--format", "dolma"])
    assert res.exit_code == 1
    assert "1 problem(s)" in res.output
    assert "p.jsonl.gz:2: missing mandatory field 'source'" in res.output
    assert "Traceback" not in res.output and "KeyError" not in res.output
    ok = CliRunner().invoke(cli, ["validate", str(DATA), "--format", "dolma"])
    assert ok.exit_code == 0, ok.output
