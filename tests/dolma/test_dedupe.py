"""Dedupe: dolma's exact attribute files, determinism across processes and bucket counts."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.cli.main import cli
from lmdata.dolma import dedupe as dd
from lmdata.dolma.config import DedupeConfig
from lmdata.errors import CorruptDataError, InvalidInputError

DATA = Path(__file__).parent.parent / "data" / "dolma" / "dataset"
URL = {"documents": {"attribute_name": "bff_duplicate_url", "key": "$.metadata.url"}}
PARA = {"paragraphs": {"attribute_name": "bff_duplicate_paragraph_spans"}}


def _docs(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(DATA / "documents", root / "documents")
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def _cfg(root: Path, name: str, mode: dict, **kw: object) -> DedupeConfig:
    return DedupeConfig.from_dict(
        {
            "documents": [str(root / "documents" / "*.jsonl.gz")],
            "dedupe": {"name": name, "skip_empty": True, **mode},  # as the fixture was made
            **kw,
        }
    )


def _raw(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


@pytest.mark.parametrize("name, mode", [("dedupe_docs", URL), ("dedupe_paragraphs", PARA)])
def test_byte_identical_to_dolma_on_one_and_two_processes(
    tmp_path: Path, name: str, mode: dict
) -> None:
    root = _docs(tmp_path)
    for procs in (1, 2):
        res = dd.dedupe(_cfg(root, name, mode, processes=procs))
        assert res.documents == 200
        for part in ("part-0.jsonl.gz", "part-1.jsonl.gz"):
            assert _raw(root / "attributes" / name / part) == _raw(
                DATA / "attributes" / name / part
            ), (procs, part)


def test_many_buckets_give_the_same_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _docs(tmp_path)
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 7)  # -> many buckets, split in parts
    monkeypatch.setattr(dd, "SPILL_EVERY", 7)
    dd.dedupe(_cfg(root, "p", PARA))
    for part in ("part-0.jsonl.gz", "part-1.jsonl.gz"):
        assert _raw(root / "attributes" / "p" / part) == _raw(
            DATA / "attributes" / "dedupe_paragraphs" / part
        )


def _write(root: Path, files: list[list[str]]) -> None:
    (root / "documents").mkdir(parents=True)
    for k, texts in enumerate(files):
        rows = [
            orjson.dumps({"id": f"{k}-{i}", "text": t, "source": "s"}) + b"\n"
            for i, t in enumerate(texts)
        ]
        (root / "documents" / f"f{k}.jsonl.gz").write_bytes(gzip.compress(b"".join(rows)))


@settings(max_examples=20, deadline=None)
@given(
    files=st.lists(
        st.lists(st.sampled_from(["a", "b", "a\nb", "b\n\nc\n", "", "  ", "é\na"]), max_size=12),
        min_size=1,
        max_size=3,
    )
)
def test_first_occurrence_in_input_order_survives(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[str]]
) -> None:
    root = tmp_path_factory.mktemp("d")
    _write(root, files)
    dd.dedupe(_cfg(root, "t", {"documents": {"attribute_name": "dup", "key": "$.text"}}))
    dd.dedupe(_cfg(root, "p", {"paragraphs": {"attribute_name": "dup", "dolma_offsets": False}}))
    seen: set[str] = set()
    pseen: set[str] = set()
    for k, texts in enumerate(files):
        rows = [
            orjson.loads(x) for x in _raw(root / "attributes" / "t" / f"f{k}.jsonl.gz").splitlines()
        ]
        prows = [
            orjson.loads(x) for x in _raw(root / "attributes" / "p" / f"f{k}.jsonl.gz").splitlines()
        ]
        for t, row, prow in zip(texts, rows, prows, strict=True):
            if not t.strip():
                assert row["attributes"] == {"dup": []}  # skipped as empty
            elif t in seen:
                assert row["attributes"] == {"dup": [[0, len(t.encode()), 1]]}
            else:
                assert row["attributes"] == {}
            seen.add(t)
            if t == "":
                assert prow["attributes"] == {}
                continue
            want = []
            pos = 0
            for piece in t.split("\n"):
                end = min(pos + len(piece) + 1, len(t))
                if piece.strip() and piece in pseen:
                    want.append([pos, end, 1])
                pseen.add(piece)
                pos = end
            assert prow["attributes"] == {"dup": want}


def test_dolma_offset_quirks() -> None:
    # ASCII text ending in \n: dolma leaves the newline out of the last paragraph
    assert dd.split_paragraphs("ab\ncd\n", "\n") == [(0, 3, "ab"), (3, 5, "cd"), (5, 5, "")]
    assert dd.split_paragraphs("ab\ncd\n", "\n", False)[1] == (3, 6, "cd")
    # non-ASCII: the last span ends one past the text (chars compared with bytes)
    assert dd.split_paragraphs("éé\nx", "\n")[-1] == (3, 5, "x")
    assert dd.split_paragraphs("éé\nx", "\n", False)[-1] == (3, 4, "x")


def test_key_must_select_a_string(tmp_path: Path) -> None:
    root = tmp_path / "d"
    _write(root, [["x"]])
    with pytest.raises(CorruptDataError, match="selects nothing") as e:
        dd.dedupe(_cfg(root, "t", {"documents": {"attribute_name": "u", "key": "$.metadata.url"}}))
    assert "f0.jsonl.gz: line 1" in str(e.value)
    assert not (root / "attributes" / "t").exists() or not any(
        (root / "attributes" / "t").iterdir()
    )
    with pytest.raises(InvalidInputError, match="did you mean"):
        _cfg(root, "t", {"documents": {"attribute_name": "u", "key": "text"}})
    with pytest.raises(InvalidInputError, match="exactly one"):
        _cfg(root, "t", {})


def dedupe_cli(root: Path, *flags: str) -> Result:
    """``lmdata dedupe -d <root>/documents/*.gz <flags>``, as a user types it."""
    return CliRunner().invoke(cli, ["dedupe", "-d", str(root / "documents" / "*.gz"), *flags])


def test_cli(tmp_path: Path) -> None:
    root = _docs(tmp_path)
    res = dedupe_cli(
        root,
        "--dedupe.name",
        "dedupe_docs",
        "--dedupe.documents.key",
        "$.metadata.url",
        "--dedupe.documents.attribute_name",
        "bff_duplicate_url",
        "-q",
    )
    assert res.exit_code == 0, res.output
    assert "17 duplicate documents" in res.output
    assert _raw(root / "attributes" / "dedupe_docs" / "part-1.jsonl.gz") == _raw(
        DATA / "attributes" / "dedupe_docs" / "part-1.jsonl.gz"
    )
