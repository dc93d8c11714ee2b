"""The mixer on dolma's fixture config, and its semantics one by one."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.dolma.config import MixerConfig, SpanReplacement, load_config
from lmdata.dolma.mixer import mix, plan_shards
from lmdata.dolma.rules import replace_spans
from lmdata.errors import CorruptDataError, InvalidInputError

FIXTURE = Path(__file__).parent.parent / "data" / "dolma"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "fx"
    shutil.copytree(FIXTURE, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def _rows(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in gzip.decompress(path.read_bytes()).splitlines()]


def _expected(root: Path) -> list[dict]:
    """What the notes say dolma's mixer writes for configs/mix.yaml, computed by hand."""
    out = []
    for part in ("part-0.jsonl.gz", "part-1.jsonl.gz"):
        docs = _rows(root / "dataset" / "documents" / part)
        sets = [
            _rows(root / "dataset" / "attributes" / n / part)
            for n in ("exp", "pii-regex", "dedupe_docs", "dedupe_paragraphs")
        ]
        for line, doc in enumerate(docs, 1):
            attrs: dict = {}
            for rows in sets:
                assert rows[line - 1]["id"] == doc["id"]
                attrs.update(rows[line - 1]["attributes"])
            if not attrs["exp__random_number_v1__random"][0][2] < 0.9:
                continue
            if attrs["exp__char_length_v1__length"][0][2] < 25:
                continue
            if attrs.get("bff_duplicate_url"):
                continue
            spans = [(s, e, "") for s, e, _ in attrs["bff_duplicate_paragraph_spans"]]
            spans += [
                (s, e, " |||EMAIL_ADDRESS||| ")
                for s, e, _ in attrs.get("pii_regex__pii_regex_v2__EMAIL_ADDRESS", [])
            ]
            text, pos, pieces = doc["text"], 0, []
            for s, e, rep in sorted(spans, key=lambda t: t[0]):
                if s >= pos:
                    pieces += [text[pos:s], rep]
                    pos = min(e, len(text))
            text = "".join(pieces) + text[pos:]
            if not text.strip().encode():
                continue
            doc = {**doc, "text": text}
            doc["metadata"] = {**doc["metadata"], "provenance": f"{part}:{line}"}
            out.append(doc)
    return out


def test_fixture_config_gives_what_dolma_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy(tmp_path)
    monkeypatch.chdir(root)  # dolma resolves the config's paths from the current folder
    res = mix(MixerConfig.from_dict(load_config("configs/mix.yaml")))
    # max_size_in_bytes 5000 < each ~10 KB input: one shard per input file
    assert res.outputs == ("mixed/fixture-mix-0000.jsonl.gz", "mixed/fixture-mix-0001.jsonl.gz")
    got = [d for o in res.outputs for d in _rows(root / o)]
    want = _expected(root)
    assert got == want
    assert res.read == 200 and res.written == len(want) == 143
    ids = {d["id"] for d in got}
    assert "doc-0022" not in ids and "doc-0002" in ids  # duplicate URL gone, its first copy kept
    assert "doc-0007" not in ids  # "OK": shorter than 25 characters
    by_id = {d["id"]: d for d in got}
    assert "jane.doe" not in by_id["doc-0126"]["text"]
    assert " |||EMAIL_ADDRESS||| " in by_id["doc-0126"]["text"]
    assert all("attributes" not in d for d in got)
    # serde_json writes keys sorted, compact
    first = gzip.decompress((root / res.outputs[0]).read_bytes()).split(b"\n")[0]
    assert first.startswith(b'{"added":"2024-09-02T12:00:00.000Z","created":')
    assert b'"provenance":"part-0.jsonl.gz:2","url"' in first
    # an existing shard is kept (resume), as dolma does
    again = mix(MixerConfig.from_dict(load_config("configs/mix.yaml")))
    assert again.skipped_shards == 2


def test_processes_do_not_change_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy(tmp_path)
    monkeypatch.chdir(root)
    cfg = load_config("configs/mix.yaml")
    cfg["processes"] = 2
    cfg["streams"][0]["output"]["path"] = "mixed2"

    from lmdata.dolma import mixer as mixer_mod

    real, driver = mixer_mod.OutputFile, os.getpid()

    def not_here(*a: object, **k: object) -> object:
        if os.getpid() == driver:
            raise AssertionError("the driver opened an output: workers write their shards")
        return real(*a, **k)  # a forked worker inherits the patch

    # the worker processes write every shard
    monkeypatch.setattr(mixer_mod, "OutputFile", not_here)
    res = mix(MixerConfig.from_dict(cfg))
    got = [d for o in res.outputs for d in _rows(root / o)]
    assert got == _expected(root)


def _tree(tmp_path: Path, docs: list[dict], attrs: dict[str, list[dict]]) -> Path:
    root = tmp_path / "t"
    (root / "documents").mkdir(parents=True)
    (root / "documents" / "a.jsonl.gz").write_bytes(
        gzip.compress(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    )
    for name, rows in attrs.items():
        (root / "attributes" / name).mkdir(parents=True)
        (root / "attributes" / name / "a.jsonl.gz").write_bytes(
            gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        )
    return root


def _stream(root: Path, **kw: object) -> dict:
    out = kw.pop("output", {})
    return {
        "name": "s",
        "documents": [str(root / "documents" / "*.gz")],
        "output": {"path": str(root / "out"), **out},
        **kw,
    }


DOCS = [
    {"id": "1", "text": "keep me"},
    {"id": "2", "text": "drop me"},
    {"id": "3", "text": "no attrs", "metadata": None},
]
ATTRS = [
    {"id": "1", "attributes": {"k": [[0, 7, 0.9]]}},
    {"id": "2", "attributes": {"k": [[0, 7, 0.1]]}},
]


def test_filters_on_missing_attributes(tmp_path: Path) -> None:
    root = _tree(tmp_path, DOCS, {"a": ATTRS})  # shorter than the documents
    ex = {"exclude": ["$.attributes[?(@.k[0][2] < 0.5)]"]}
    res = mix(
        MixerConfig.from_dict({"streams": [_stream(root, attributes=["a", "gone"], filter=ex)]})
    )
    got = _rows(Path(res.outputs[0]))
    # doc 3 has no attributes at all: an exclude on them cannot fire
    assert [d["id"] for d in got] == ["1", "3"]
    assert got[1]["metadata"] == {"provenance": "a.jsonl.gz:3"}
    assert any("gone" in w and "missing" in w for w in res.warnings)
    assert any("missing attributes from line 3" in w for w in res.warnings)
    inc = {"include": ["$.attributes[?(@.k[0][2] > 0.5)]"]}
    res = mix(
        MixerConfig.from_dict(
            {
                "streams": [
                    _stream(root, attributes=["a"], filter=inc, output={"path": str(root / "o2")})
                ]
            }
        )
    )
    assert [d["id"] for d in _rows(Path(res.outputs[0]))] == ["1"]  # include needs the key


def test_mismatched_ids_fail_with_both_files(tmp_path: Path) -> None:
    bad = [ATTRS[1], ATTRS[0], {"id": "3", "attributes": {}}]
    root = _tree(tmp_path, DOCS, {"a": bad})
    cfg = MixerConfig.from_dict(
        {"streams": [_stream(root, attributes=["a"], filter={"include": ["$.id"]})]}
    )
    with pytest.raises(CorruptDataError, match="but line 1 of ") as e:
        mix(cfg)
    assert "attributes/a/a.jsonl.gz" in str(e.value) and "documents/a.jsonl.gz" in str(e.value)
    assert not (root / "out").exists() or not any((root / "out").iterdir())


def test_jq_filter_discard_and_min_length_in_bytes(tmp_path: Path) -> None:
    docs = [
        {"id": "1", "text": " éé ", "x": 1},
        {"id": "2", "text": "\u3000ab\u3000", "x": 2},
        {"id": "3", "text": "abcde", "x": 3},
    ]
    root = _tree(tmp_path, docs, {})
    cfg = MixerConfig.from_dict(
        {
            "streams": [
                _stream(
                    root,
                    filter={"syntax": "jq", "exclude": [".x == 3"]},
                    output={"discard_fields": ["x"], "min_text_length": 3},
                )
            ]
        }
    )
    got = _rows(Path(mix(cfg).outputs[0]))
    # "éé" is 4 bytes (kept), "ab" after trimming U+3000 is 2 bytes (dropped)
    assert got == [{"id": "1", "text": " éé ", "metadata": {"provenance": "a.jsonl.gz:1"}}]


def test_span_replacement_rules() -> None:
    doc = {
        "text": "0123456789",
        "attributes": {
            "a": [[2, 5, 0.9], [3, 8, 0.9], [8, 20, 0.7]],
            "b": [[0, 1, 0.2], [6, 7, 0.6]],
        },
    }
    rules = (
        SpanReplacement("$.attributes.a", "[{}]", min_score=0.8),
        SpanReplacement("$.attributes.b", "#", max_score=0.5),
        SpanReplacement("$.attributes.missing", "?", min_score=0),
    )
    # [3, 8] starts inside the replaced [2, 5] and is skipped; [8, 20] is below min_score
    assert replace_spans(doc["text"], doc, rules) == "#1[234]56789"
    doc["attributes"]["a"].append([7, 20, 1])  # dolma's one-past-the-end spans are clamped
    assert replace_spans(doc["text"], doc, rules) == "#1[234]56[789]"


def test_sharding_by_input_size(tmp_path: Path) -> None:
    root = tmp_path / "t"
    (root / "documents").mkdir(parents=True)
    for i in range(4):
        (root / "documents" / f"{i}.jsonl.gz").write_bytes(
            gzip.compress(b'{"id":"a","text":"b"}\n' * 10, mtime=0)
        )
    size = (root / "documents" / "0.jsonl.gz").stat().st_size

    def mk(n):
        return MixerConfig.from_dict(
            {
                "streams": [
                    _stream(root, filter={"include": ["$.id"]}, output={"max_size_in_bytes": n})
                ]
            }
        ).streams[0]

    assert [len(s.inputs) for s in plan_shards(mk(size * 2))] == [2, 2]
    assert [len(s.inputs) for s in plan_shards(mk(size * 2 - 1))] == [1, 1, 1, 1]
    assert [len(s.inputs) for s in plan_shards(mk(10**9))] == [4]
    assert plan_shards(mk(1))[3].output.endswith("/s-0003.jsonl.gz")


def test_config_errors() -> None:
    with pytest.raises(InvalidInputError, match="filter` or a `span_replacement"):
        MixerConfig.from_dict(
            {"streams": [{"name": "s", "documents": ["x"], "output": {"path": "o"}}]}
        )
    with pytest.raises(InvalidInputError, match="filter is empty"):
        MixerConfig.from_dict(
            {"streams": [{"name": "s", "documents": ["x"], "filter": {}, "output": {"path": "o"}}]}
        )


def test_cli_mix_with_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy(tmp_path)
    monkeypatch.chdir(root)
    dry = CliRunner().invoke(cli, ["mix", "-c", "configs/mix.yaml", "--dryrun"])
    assert dry.exit_code == 0 and dry.output.count('"stream":"fixture-mix"') == 2
    res = CliRunner().invoke(cli, ["mix", "-c", "configs/mix.yaml", "-p", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert "wrote 143" in res.output and "documents/s" in res.output
    bad = CliRunner().invoke(cli, ["mix", "-c", "configs/mix.yaml", "--set", "processes=0"])
    assert bad.exit_code == 2 and "processes must be an integer >= 1" in bad.output
