"""Tokenizer provenance: every token format records what made it, its origin reader still opens
it, ``info`` shows it, and ``cat --decode`` finds the tokenizer file through it."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import lmdata
from lmdata import _provenance
from lmdata.cli.main import cli
from lmdata.tokenize import load_tokenizer
from tests.inspect.conftest import bpe_file  # noqa: F401  (a fixture)

TEXTS = ["hello world", "héllo wörld 日本語\nline two", "<script>alert(1)</script>", "x"]
FORMATS = ["flat-tokens", "mds", "modalities", "atlas"]
ROOT = Path(__file__).parents[2]
ZARR2_PY = ROOT / ".venv" / "extra-zarr2" / "bin" / "python"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def made(tmp_path: Path, fmt: str, tokenizer, texts=TEXTS) -> Path:
    out = tmp_path / f"out.{fmt}"
    eod = {"eod": "<|endoftext|>"} if fmt == "modalities" and tokenizer != "bytes" else {}
    if fmt == "modalities" and tokenizer == "bytes":
        eod = {"eod_id": 0}
    lmdata.tokenize(iter(texts), out, format=fmt, tokenizer=tokenizer, workers=0, **eod)
    return out


def token_view(path: Path):
    r = lmdata.open(path)
    return r if hasattr(r, "boundaries") else lmdata.open(path, token_column="tokens")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_token_format_records_its_tokenizer(tmp_path, bpe_file, fmt):  # noqa: F811
    out = made(tmp_path, fmt, str(bpe_file))
    prov = lmdata.info(out)["provenance"]
    t = prov["tokenizer"]
    tok = load_tokenizer(bpe_file)
    assert t["kind"] == "huggingface" and t["name"] == "tokenizer.json"
    assert t["path"] == str(bpe_file.resolve())
    assert t["sha256"] == hashlib.sha256(bpe_file.read_bytes()).hexdigest()
    assert t["vocab_size"] == tok.vocab_size
    assert t["special_tokens"] == {"<|endoftext|>": tok.token_id("<|endoftext|>")}
    eod = tok.token_id("<|endoftext|>") if fmt == "modalities" else None
    assert t["eod_id"] == eod
    assert prov["lmdata_version"] == lmdata.__version__
    assert prov["command"].startswith("lmdata.tokenize(<list_iterator of documents>, ")
    assert lmdata.validate(out) == []
    # the data are what they would be without provenance
    r = token_view(out)
    ids = tok.encode_batch(TEXTS)
    got = [r[i].tolist() for i in range(len(r))]
    assert got == [x.tolist() + ([eod] if eod is not None else []) for x in ids]


def test_the_cli_records_its_command_line(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "o.pbin"
    args = ["tokenize", str(src), str(out), "--to", "modalities", "--eod-id", "0", "--workers", "0"]
    assert run(*args, "-q").exit_code == 0
    prov = lmdata.info(out)["provenance"]
    assert prov["command"] == "lmdata " + " ".join([*args, "-q"])
    assert prov["tokenizer"]["kind"] == "bytes" and prov["tokenizer"]["eod_id"] == 0


def test_modalities_sidecar_follows_its_file(tmp_path):
    out = made(tmp_path, "modalities", "bytes")
    side = Path(str(out) + ".lmdata.json")
    assert side.exists() and "provenance" in lmdata.info(out)
    # the .pbin itself is what the writer makes without provenance (the origin reads it)
    plain = tmp_path / "plain.pbin"
    with lmdata.writer(plain, "modalities", vocab_size=257, eod_id=0) as w:
        for ids in load_tokenizer("bytes").encode_batch(TEXTS):
            w.write(ids)
    assert out.read_bytes() == plain.read_bytes()
    # a file written over it by another tool: the stale sidecar no longer matches
    shutil.copy(plain, out)
    with open(out, "ab") as f:
        f.write(b"\0")
    assert "provenance" not in lmdata.info(out, format="modalities")
    # lmdata writing over it without provenance removes the sidecar
    with lmdata.writer(out, "modalities", vocab_size=257, overwrite=True) as w:
        w.write([1, 2])
    assert not side.exists()


def test_records_are_parsed_as_untrusted(tmp_path):
    hostile = {
        "tokenizer": {
            "kind": ["x"],
            "vocab_size": "1e9",
            "eod_id": True,
            "special_tokens": {"<s>": 1, "bad": "2", "worse": [3]},
            "path": {"$": 1},
            "extra": "dropped",
        },
        "command": 7,
        "other": {"deep": 1},
    }
    got = _provenance.parse(hostile)
    assert got["tokenizer"]["kind"] == "unknown" and got["tokenizer"]["vocab_size"] is None
    assert got["tokenizer"]["eod_id"] is None and got["tokenizer"]["path"] is None
    assert got["tokenizer"]["special_tokens"] == {"<s>": 1}
    assert got["command"] is None and "other" not in got and "extra" not in got["tokenizer"]
    assert _provenance.parse({"tokenizer": "x"}) is None and _provenance.parse([1]) is None
    # a broken zarr attribute or sidecar: the dataset simply has no provenance
    out = made(tmp_path, "modalities", "bytes")
    Path(str(out) + ".lmdata.json").write_text("{not json")
    assert "provenance" not in lmdata.info(out)


@pytest.mark.parametrize("fmt", ["atlas", "modalities"])
def test_an_oversized_record_file_is_no_provenance(tmp_path, fmt):
    out = made(tmp_path, fmt, "bytes")
    side = out / "lmdata.json" if fmt == "atlas" else Path(str(out) + ".lmdata.json")
    assert "provenance" in lmdata.info(out)
    side.write_bytes(b" " * (_provenance.MAX_BYTES + 1) + b"{}")
    assert "provenance" not in lmdata.info(out)  # not UnsafeDataError from the read


def test_info_shows_the_tokenizer_and_the_vocabulary_a_model_needs(tmp_path, bpe_file):  # noqa: F811
    out = made(tmp_path, "flat-tokens", str(bpe_file))
    vocab = load_tokenizer(bpe_file).vocab_size
    text = run("info", str(out)).output
    assert (
        "kind: huggingface" in text
        and f"sha256: {hashlib.sha256(bpe_file.read_bytes()).hexdigest()}" in text
    )
    assert f"a model needs a vocabulary of at least {vocab:,}" in text
    assert "special tokens: <|endoftext|>" in text
    js = json.loads(run("info", str(out), "--json").output)
    assert js["model_vocab_size"] == vocab
    assert js["provenance"]["tokenizer"]["vocab_size"] == vocab


def test_cat_decode_finds_the_recorded_tokenizer(tmp_path, bpe_file):  # noqa: F811
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    tok_file = tok_dir / "tokenizer.json"
    shutil.copy(bpe_file, tok_file)
    out = made(tmp_path, "mds", str(tok_file))
    lines = [orjson.loads(x) for x in run("cat", str(out), "--decode").output.splitlines()]
    assert [x["text"] for x in lines] == TEXTS  # one shape: MDS as every format
    # moved beside the dataset: found there, checked by its hash
    moved = tmp_path / "tokenizer.json"
    tok_file.rename(moved)
    assert run("cat", str(out), "--decode", "--raw", "-n", "1").output == TEXTS[0] + "\n"
    # changed: not used; the error says which file the dataset needs
    moved.write_text(moved.read_text().replace('"<|endoftext|>"', '"<|end|>"'))
    res = CliRunner().invoke(cli, ["cat", str(out), "--decode"])
    assert res.exit_code == 2 and "not found unchanged" in res.output
    assert str(tok_file) in res.output and "--tokenizer" in res.output
    # another tokenizer file given by hand: used, with a warning
    res = CliRunner().invoke(cli, ["cat", str(out), "--decode", "--tokenizer", str(moved)])
    assert res.exit_code == 0 and "warning: the dataset was made with" in res.output
    assert res.output.count('"text"') == len(TEXTS)


def test_cat_decode_of_a_bytes_dataset_needs_no_tokenizer(tmp_path):
    out = made(tmp_path, "flat-tokens", "bytes")
    res = run("cat", str(out), "--decode")
    assert [orjson.loads(x)["text"] for x in res.output.splitlines()] == TEXTS
    # a dataset that records nothing still needs --tokenizer
    bare = tmp_path / "bare.zarr"
    with lmdata.writer(bare, "flat-tokens") as w:
        w.write([1, 2])
    res = CliRunner().invoke(cli, ["cat", str(bare), "--decode"])
    assert res.exit_code == 2 and "does not record the tokenizer" in res.output, res.output


def test_stats_decodes_with_the_recorded_tokenizer(tmp_path):
    out = made(tmp_path, "modalities", "bytes")
    s = json.loads(run("stats", str(out), "--json", "-q", "--top", "3").output)
    assert s["tokenizer"] == "bytes" and all("text" in t for t in s["top_tokens"])
    assert s["max_token_id"] < 256 and s["model_vocab_size"] == 257  # the tokenizer's vocabulary
    text = run("stats", str(out), "-q").output
    assert "a model needs a vocabulary of at least 257" in text


# ---- the origin readers ----------------------------------------------------------------------


@pytest.mark.skipif(not ZARR2_PY.exists(), reason="make install creates the zarr-python 2 venv")
def test_zarr2_opens_flat_tokens_with_provenance(tmp_path):
    out = made(tmp_path, "flat-tokens", "bytes")
    code = (
        "import sys, json, zarr; g = zarr.open_group(sys.argv[1], mode='r'); "
        "s = g['train']; e = s['encoded_tokens'][:]; b = s['seq_starts'][:]; "
        "print(json.dumps({'seqs': [(e[b[i]:b[i+1]] >> 1).tolist() for i in range(len(b)-1)], "
        "'attrs': g.attrs.asdict()}))"
    )
    res = subprocess.run(
        [str(ZARR2_PY), "-c", code, str(out)], capture_output=True, text=True, check=True
    )
    got = json.loads(res.stdout)
    assert got["seqs"] == [x.tolist() for x in load_tokenizer("bytes").encode_batch(TEXTS)]
    assert got["attrs"]["lmdata"]["tokenizer"]["kind"] == "bytes"


def test_zarr3_opens_flat_tokens_with_provenance(tmp_path):
    zarr = pytest.importorskip("zarr")
    out = made(tmp_path, "flat-tokens", "bytes")
    g = zarr.open_group(str(out), mode="r")
    s = g["train"]
    e, b = s["encoded_tokens"][:], s["seq_starts"][:]
    got = [(e[b[i] : b[i + 1]] >> 1).tolist() for i in range(len(b) - 1)]
    assert got == [x.tolist() for x in load_tokenizer("bytes").encode_batch(TEXTS)]
    assert g.attrs["lmdata"]["tokenizer"]["kind"] == "bytes"


def test_streaming_reads_mds_with_provenance(tmp_path):
    from tests.formats.mds_samples import run_streaming, streaming_python

    if streaming_python() is None:
        pytest.skip("mosaicml-streaming venv .venv/extra-streaming is absent (make install)")
    out = made(tmp_path, "mds", "bytes")
    assert b'"lmdata"' in (out / "index.json").read_bytes()
    result = tmp_path / "read.pkl"
    run_streaming({"op": "read", "local": str(out), "result": str(result), "indices": [2]})
    with open(result, "rb") as f:
        got = pickle.load(f)  # written by our own helper in this test
    ids = load_tokenizer("bytes").encode_batch(TEXTS)
    assert got["size"] == len(TEXTS)
    kind, dtype, _shape, raw = got["random"][0]["tokens"]
    assert kind == "ndarray" and np.frombuffer(raw, dtype).tolist() == ids[2].tolist()


def test_the_origin_atlas_reader_ignores_the_record(tmp_path):
    from tests.formats.test_atlas_compat import origin_read

    out = made(tmp_path, "atlas", "bytes")
    assert (out / "lmdata.json").is_file()
    got = origin_read(out)
    assert [g["tokens"].tolist() for g in got] == [
        x.tolist() for x in load_tokenizer("bytes").encode_batch(TEXTS)
    ]


def _tokenizer_of(path: Path) -> dict:
    return lmdata.info(path)["provenance"]["tokenizer"]


@pytest.mark.parametrize(
    ("src", "dst"),
    [("flat-tokens", "modalities"), ("modalities", "flat-tokens"), ("flat-tokens", "mds")],
)
def test_convert_keeps_the_tokenizer_record(tmp_path, bpe_file, src, dst):  # noqa: F811
    made_ = made(tmp_path, src, str(bpe_file))
    out = tmp_path / ("c.pbin" if dst == "modalities" else f"c.{dst}")
    lmdata.convert(made_, out, format=dst, split="train" if src == "flat-tokens" else None)
    assert _tokenizer_of(out) == _tokenizer_of(made_)
    vocab = load_tokenizer(bpe_file).vocab_size
    assert lmdata.info(out)["model_vocab_size"] == vocab  # not the largest id + 1
    decoded = [
        orjson.loads(x)["text"] for x in run("cat", str(out), "--decode").output.splitlines()
    ]
    assert decoded and all(isinstance(t, str) for t in decoded)  # cat --decode finds it


@pytest.mark.parametrize("fmt", ["modalities", "mds", "atlas"])
def test_merge_keeps_the_tokenizer_record_and_refuses_two(tmp_path, bpe_file, fmt):  # noqa: F811
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    parts = [made(a, fmt, str(bpe_file)), made(b, fmt, str(bpe_file), texts=TEXTS[:2])]
    if fmt == "mds":  # merged partitions keep their folder names
        parts[1] = parts[1].rename(b / "second.mds")
    out = tmp_path / ("m.pbin" if fmt == "modalities" else "m")
    lmdata.merge(parts, out)
    assert _tokenizer_of(out) == _tokenizer_of(parts[0])
    c = tmp_path / "c"
    c.mkdir()
    other = made(c, fmt, "bytes")
    if fmt == "mds":
        other = other.rename(c / "third.mds")
    with pytest.raises(lmdata.errors.InvalidInputError, match="another tokenizer"):
        lmdata.merge([parts[0], other], tmp_path / ("x.pbin" if fmt == "modalities" else "x"))


def test_an_atlas_append_keeps_the_tokenizer_record(tmp_path, bpe_file):  # noqa: F811
    from lmdata.formats.atlas import Writer

    out = made(tmp_path, "atlas", str(bpe_file))
    before = _tokenizer_of(out)
    with Writer(out, append=True) as w:
        w.write({"tokens": np.array([1, 2], dtype=np.uint16)})
    assert _tokenizer_of(out) == before and len(lmdata.open(out)) == len(TEXTS) + 1


def test_info_returns_the_vocabulary_a_model_needs(tmp_path, bpe_file):  # noqa: F811
    out = made(tmp_path, "modalities", str(bpe_file))
    assert lmdata.info(out)["model_vocab_size"] == load_tokenizer(bpe_file).vocab_size
    bare = tmp_path / "bare.pbin"
    with lmdata.writer(bare, "modalities", vocab_size=1000) as w:
        w.write(np.array([3, 41], dtype=np.uint16))
    assert lmdata.info(bare)["model_vocab_size"] == 42  # no record: the largest id + 1
    assert "model_vocab_size" not in lmdata.info(bare, scan=False)
