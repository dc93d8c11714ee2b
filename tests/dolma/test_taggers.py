"""Taggers: dolma's exact outputs on its own fixture, tricky text, seeding, user taggers."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import regex
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.cli.main import cli
from lmdata.dolma.tag import tag_paths
from lmdata.dolma.taggers import group_output, make_tagger, tag_document, whitespace_count
from lmdata.errors import InvalidInputError

DATA = Path(__file__).parent.parent / "data" / "dolma" / "dataset"


def _rows(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in gzip.decompress(path.read_bytes()).splitlines()]


def _docs(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(DATA / "documents", root / "documents")
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def test_reproduces_dolmas_tagger_files(tmp_path: Path) -> None:
    root = _docs(tmp_path)
    tag_paths(
        str(root),
        ["char_length_v1", "char_length_with_paragraphs_v1", "whitespace_tokenizer_v1"],
        experiment="exp",
    )
    tag_paths(str(root / "documents" / "*.jsonl.gz"), ["pii_regex_v2"], experiment="pii-regex")
    for part in ("part-0.jsonl.gz", "part-1.jsonl.gz"):
        # pii-regex holds only pii_regex_v2: byte-identical rows
        ours = gzip.decompress((root / "attributes" / "pii-regex" / part).read_bytes())
        assert ours == gzip.decompress((DATA / "attributes" / "pii-regex" / part).read_bytes())
        # exp also holds random_number_v1 (unseeded in dolma) and olmo_pretokenizer_v1
        mine = _rows(root / "attributes" / "exp" / part)
        theirs = _rows(DATA / "attributes" / "exp" / part)
        assert len(mine) == len(theirs) == 100
        for a, b in zip(mine, theirs, strict=True):
            keep = {
                k: v
                for k, v in b["attributes"].items()
                if "random_number" not in k and "olmo_pretokenizer" not in k
            }
            assert a == {**b, "attributes": keep}
            assert list(a) == ["id", "attributes", "source"]


def _tag(name: str, text: str) -> dict:
    return tag_document({"id": "1", "source": "s", "text": text}, [("x", name, make_tagger(name))])


@pytest.mark.parametrize(
    "text, want",
    [
        ("", {"x__char_length_with_paragraphs_v1__document": [[0, 0, 0.0]]}),
        ("  \n\n ", {"x__char_length_with_paragraphs_v1__document": [[0, 5, 5.0]]}),
        (
            "ab\ncd\n",
            {
                "x__char_length_with_paragraphs_v1__paragraph": [[0, 3, 3.0], [3, 6, 3.0]],
                "x__char_length_with_paragraphs_v1__document": [[0, 6, 6.0]],
            },
        ),
        (
            "é👍🏽\n\n  \nz",
            {
                "x__char_length_with_paragraphs_v1__paragraph": [[0, 4, 4.0], [8, 9, 1.0]],
                "x__char_length_with_paragraphs_v1__document": [[0, 9, 9.0]],
            },
        ),
    ],
)
def test_paragraph_offsets_on_tricky_text(text: str, want: dict) -> None:
    assert _tag("char_length_with_paragraphs_v1", text) == want


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=40) | st.text(max_size=20))
def test_whitespace_count_is_the_regex_split(text: str) -> None:
    # the ASCII fast path counts runs from character classes; every ASCII class boundary
    # (controls \x1c-\x1f are \s to the regex module, "_" is \w) must agree with the split
    assert whitespace_count(text) == len(regex.split(r"\w+|[^\w\s]+", text))


def test_ascii_classes_are_the_regex_modules() -> None:
    from lmdata.dolma.taggers import _ASCII_CLASS

    for i in range(128):
        c = chr(i)
        want = "w" if regex.match(r"\w", c) else " " if regex.match(r"\s", c) else "p"
        assert chr(_ASCII_CLASS[i]) == want, i


def test_whitespace_count_examples() -> None:
    for text, n in (("", 1), (" ", 1), ("a", 2), ("a b", 3), ("a,b", 4), ("x_1 \x1f!", 3)):
        assert whitespace_count(text) == n, text


def test_length_taggers_on_tricky_text() -> None:
    assert _tag("char_length_v1", "") == {"x__char_length_v1__length": [[0, 0, 0.0]]}
    assert _tag("bytes_length_v1", "é👍") == {"x__bytes_length_v1__length": [[0, 2, 6.0]]}
    # dolma counts the pieces between \w+ / symbol runs; \w covers joiners and marks
    # (the `regex` module): a ZWJ between two emoji is a run of its own, e + U+0301 one word
    assert _tag("whitespace_tokenizer_v1", "") == {
        "x__whitespace_tokenizer_v1__length": [[0, 0, 1.0]]
    }
    assert _tag("whitespace_tokenizer_v1", "   \n") == {
        "x__whitespace_tokenizer_v1__length": [[0, 4, 1.0]]
    }
    assert _tag("whitespace_tokenizer_v1", "a, b.")["x__whitespace_tokenizer_v1__length"] == [
        [0, 5, 5.0]
    ]
    assert _tag("whitespace_tokenizer_v1", "👨\u200d👩")["x__whitespace_tokenizer_v1__length"] == [
        [0, 3, 4.0]
    ]
    assert _tag("whitespace_tokenizer_v1", "e\u0301")["x__whitespace_tokenizer_v1__length"] == [
        [0, 2, 2.0]
    ]
    out = _tag("whitespace_tokenizer_with_paragraphs_v1", "a b\n\nc\n")
    assert out == {
        "x__whitespace_tokenizer_with_paragraphs_v1__paragraph": [[0, 4, 3.0], [5, 7, 2.0]],
        "x__whitespace_tokenizer_with_paragraphs_v1__document": [[0, 7, 5.0]],
    }


def test_pii_regex() -> None:
    text = "Mail me at a.b@ex.com now, call (555) 123-4567 or see 10.0.0.1.\n"
    out = _tag("pii_regex_v2", text)
    assert out["x__pii_regex_v2__EMAIL_ADDRESS"] == [[10, 22, 1.0]]  # with the spaces around
    assert text[10:22] == " a.b@ex.com "
    assert out["x__pii_regex_v2__PHONE_NUMBER"] == [[31, 46, 1.0]]
    assert out["x__pii_regex_v2__IP_ADDRESS"] == [[54, 62, 1.0]]
    assert out["x__pii_regex_v2__doc"] == [[0, len(text), round(3 / 11, 5)]]
    # identifiers near isbn/doi/# are not PII; empty text scores -1 like dolma's v2
    assert "x__pii_regex_v2__PHONE_NUMBER" not in _tag("pii_regex_v2", "isbn 555 123 4567")
    assert _tag("pii_regex_v2", " ") == {"x__pii_regex_v2__doc": [[0, 1, -1.0]]}


def test_random_number_is_seeded_and_order_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_tagger("random_number_v1", seed=1)
    b = make_tagger("random_number_v1", seed=2)
    doc = {"id": "d", "source": "s", "text": "x"}
    assert list(a.predict(doc)) == list(make_tagger("random_number_v1", seed=1).predict(doc))
    assert list(a.predict(doc)) != list(b.predict(doc))
    root = _docs(tmp_path)

    from lmdata.dolma import tag as tag_mod

    real, driver = tag_mod.OutputFile, os.getpid()

    def not_here(*a: object, **k: object) -> object:
        if os.getpid() == driver:
            raise AssertionError("the driver opened an output: workers write attribute files")
        return real(*a, **k)  # a forked worker inherits the patch

    with monkeypatch.context() as m:
        m.setattr(tag_mod, "OutputFile", not_here)
        tag_paths(str(root), ["random_number_v1"], experiment="r1", seed=5, processes=2)
    tag_paths(str(root), ["random_number_v1"], experiment="r2", seed=5)
    r1 = [
        next(iter(r["attributes"].values()))[0][2]
        for r in _rows(root / "attributes" / "r1" / "part-0.jsonl.gz")
    ]
    r2 = [
        next(iter(r["attributes"].values()))[0][2]
        for r in _rows(root / "attributes" / "r2" / "part-0.jsonl.gz")
    ]
    assert r1 == r2 and all(0 <= x < 1 for x in r1) and len(set(r1)) > 90


def test_group_output_naming_and_rounding() -> None:
    spans = [(0, 3, "a-b", 0.123456789), (1, 2, "a-b"), (0, 1, "", 5.0)]
    assert group_output(spans, "my-exp", "t.v1", defaults=["none"]) == {
        "my_exp__t_v1__none": [],
        "my_exp__t_v1__a_b": [[0, 3, 0.12346], [1, 2, 1.0]],
    }


USER_TAGGER = """
from lmdata.dolma.taggers import Span

class Vowels:
    name = "vowels_v1"

    def predict(self, doc):
        n = sum(c in "aeiou" for c in doc["text"])
        return [Span(0, len(doc["text"]), "count", n)] if n else []
"""


def test_user_tagger_module_and_cli(tmp_path: Path) -> None:
    root = _docs(tmp_path)
    mod = tmp_path / "mytaggers.py"
    mod.write_text(USER_TAGGER)
    res = CliRunner().invoke(
        cli,
        [
            "tag",
            "-d",
            str(root),
            "-t",
            "vowels_v1",
            "-t",
            "char_length_v1",
            "--tagger-modules",
            str(mod),
            "-q",
            "-p",
            "2",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "200 documents" in res.output and "documents/s" in res.output
    rows = _rows(root / "attributes" / "vowels_v1" / "part-1.jsonl.gz")
    assert rows[59]["id"] == "doc-0159"  # the empty document: no spans, key left out
    assert rows[59]["attributes"] == {}
    assert rows[0]["attributes"]["vowels_v1__vowels_v1__count"][0][2] > 10
    assert (root / "attributes" / "char_length_v1" / "part-0.jsonl.gz").is_file()
    again = CliRunner().invoke(
        cli, ["tag", "-d", str(root), "-t", "vowels_v1", "--tagger-modules", str(mod), "-q"]
    )
    assert "(2 already done)" in again.output
    listed = CliRunner().invoke(cli, ["tag", "--list", "--tagger-modules", str(mod)])
    assert "vowels_v1" in listed.output and "pii_regex_v2" in listed.output


def test_unknown_tagger_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="unknown tagger 'nope'"):
        tag_paths(str(_docs(tmp_path)), ["nope"])


def test_tag_and_mix_workers_import_neither_yaml_nor_regex() -> None:
    # every spawned worker pays its imports: configs arrive parsed, the regex module is only
    # needed for text that is not ASCII
    code = (
        "import sys, lmdata.dolma.tag, lmdata.dolma.mixer\n"
        "print(sorted(m for m in ('yaml', 'regex') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert whitespace_count("é x") == 3  # and the regex module still serves non-ASCII text


def test_tag_paths_takes_the_engine_as_tag_does(tmp_path: Path) -> None:
    # engine= is no config key: it reaches tag() and gives the bytes of the default engine
    rows = [{"id": str(i), "text": f"doc {i} " * (i % 5 + 1)} for i in range(40)]
    out = []
    for engine, n in (("inprocess", 1), ("processes", 2)):
        root = tmp_path / engine
        (root / "documents").mkdir(parents=True)
        doc = root / "documents" / "part-0.jsonl"
        doc.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        tag_paths(str(root), ["char_length_v1"], experiment="e", engine=engine, processes=n)
        out.append((root / "attributes" / "e" / "part-0.jsonl").read_bytes())
    assert out[0] == out[1] and out[0].count(b"\n") == 40
    with pytest.raises(InvalidInputError, match="engine"):
        tag_paths(str(tmp_path / "inprocess"), ["char_length_v1"], experiment="c", engine="bogus")
