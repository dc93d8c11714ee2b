"""``lmdata.tokenize``: the same bytes as the CLI for every kind of input, with no job object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import lmdata
from lmdata import _provenance
from lmdata.cli.main import cli
from lmdata.errors import InvalidInputError
from tests.inspect.conftest import bpe_file  # noqa: F401  (a fixture)

DOCS = [{"id": f"d{i}", "text": f"document {i} " * (i % 7) + "é日本"} for i in range(40)]


def files(root: Path) -> dict[str, bytes]:
    """Every file of a dataset by relative path, the provenance record without its command."""
    out = {}
    for p in sorted(root.rglob("*")) if root.is_dir() else [root]:
        if p.is_file():
            data = p.read_bytes()
            if p.name in (".zattrs", "index.json") and b'"lmdata"' in data:
                obj = json.loads(data)
                obj[_provenance.KEY].pop("command")
                data = json.dumps(obj, sort_keys=True).encode()
            out[str(p.relative_to(root)) if root.is_dir() else p.name] = data
    return out


@pytest.fixture()
def corpus(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return src


@pytest.mark.parametrize(
    ("fmt", "cli_opts", "api_opts"),
    [
        ("flat-tokens", ["--validation-fraction", "0.2"], {"validation_fraction": 0.2}),
        ("mds", ["--compression", "zstd"], {"compression": "zstd"}),
    ],
)
def test_same_bytes_as_the_cli(tmp_path, corpus, bpe_file, fmt, cli_opts, api_opts):  # noqa: F811
    a, b = tmp_path / "cli", tmp_path / "api"
    args = ["tokenize", str(corpus), str(a), "--to", fmt, "--tokenizer", str(bpe_file)]
    res = CliRunner().invoke(cli, [*args, *cli_opts, "--workers", "0", "-q"])
    assert res.exit_code == 0, res.output
    summary = lmdata.tokenize(
        corpus, b, format=fmt, tokenizer=bpe_file, workers=0, batch_docs=7, **api_opts
    )
    assert summary.documents_written == len(DOCS) and summary.tokens > 0
    assert files(a) == files(b)
    assert lmdata.info(b)["provenance"]["command"].startswith(f"lmdata.tokenize('{corpus}', ")


def test_documents_as_python_objects(tmp_path, corpus, bpe_file):  # noqa: F811
    from tokenizers import Tokenizer

    want = tmp_path / "from-file"
    lmdata.tokenize([corpus], want, format="flat-tokens", tokenizer=str(bpe_file), workers=0)
    ref = files(want)
    texts = [d["text"] for d in DOCS]
    for i, inputs in enumerate(
        [
            DOCS,  # a list of dicts
            iter(texts),  # an iterator of strings
            (d for d in DOCS),  # a generator of dicts
        ]
    ):
        out = tmp_path / f"o{i}"
        s = lmdata.tokenize(inputs, out, format="flat-tokens", tokenizer=bpe_file, workers=0)
        assert s.documents_written == len(DOCS)
        assert files(out) == ref, i
    # an already-built tokenizer object
    out = tmp_path / "obj"
    tok = Tokenizer.from_file(str(bpe_file))
    lmdata.tokenize(DOCS, out, format="flat-tokens", tokenizer=tok, workers=0)
    assert [f for f, v in files(out).items() if v != ref.get(f)] == [".zattrs"]  # path differs
    assert lmdata.info(out)["provenance"]["tokenizer"]["sha256"] is not None


def test_mistakes_are_said_plainly(tmp_path):
    with pytest.raises(InvalidInputError, match="Strings in a list are paths"):
        lmdata.tokenize(["hello world"], tmp_path / "o", format="flat-tokens")
    with pytest.raises(InvalidInputError, match="document 1 is a int"):
        lmdata.tokenize(iter(["a", 2]), tmp_path / "o", format="flat-tokens", workers=0)
    with pytest.raises(InvalidInputError, match="resume=True needs inputs that are files"):
        lmdata.tokenize(DOCS, tmp_path / "o", format="flat-tokens", resume=True)
    with pytest.raises(InvalidInputError, match="cannot tokenize with a object"):
        lmdata.tokenize(DOCS, tmp_path / "o", format="flat-tokens", tokenizer=object())
    with pytest.raises(InvalidInputError, match="cannot tokenize into"):
        lmdata.tokenize(DOCS, tmp_path / "o", format="dolma")
    assert not (tmp_path / "o").exists()


def test_the_function_survives_imports_of_the_package():
    import lmdata.tokenize.pipeline
    from lmdata.tokenize import ByteTokenizer  # noqa: F401

    assert callable(lmdata.tokenize) and lmdata.tokenize.__module__ == "lmdata.tokenize.api"
    assert "tokenize" in lmdata.__all__
