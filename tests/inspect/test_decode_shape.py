"""`lmdata cat --decode` prints one shape whatever the format: {"index", "split" (where the
dataset has splits), "text"}. Every format tokenize writes, taken from the registry, so a new
token format is checked too."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from lmdata import formats
from lmdata.cli.main import cli
from lmdata.tokenize.api import tokenize

TEXTS = ["first document", "", "héllo wörld 日本語\nsecond line", '{"not": "json"}']
TOKEN_FORMATS = [n for n in formats.names() if formats.spec(n).tokens is not None]
SUFFIX = {"modalities": ".pbin"}


def _cat(*args: str) -> list[dict]:
    res = CliRunner().invoke(cli, ["cat", *args, "--decode"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return [orjson.loads(x) for x in res.stdout.splitlines()]


def test_every_token_format_is_here() -> None:
    assert {"flat-tokens", "modalities", "mds", "atlas"} <= set(TOKEN_FORMATS)


@pytest.mark.parametrize("fmt", TOKEN_FORMATS)
def test_cat_decode_prints_one_shape_for_every_token_format(tmp_path, fmt) -> None:
    texts = [t for t in TEXTS if t]  # MDS cannot store an empty token array
    out = tmp_path / f"out{SUFFIX.get(fmt, '')}"
    tokenize([{"text": t} for t in texts], out, format=fmt, append_eod=False)
    fixed = formats.spec(fmt).splits  # a dataset of fixed splits names the one read
    split = {"split": fixed[0]} if fixed else {}
    want = [{"index": i, **split, "text": t} for i, t in enumerate(texts)]
    assert _cat(str(out)) == want
    assert _cat(str(out), "-n", "1", "--offset", "2") == want[2:3]


def test_a_split_asked_for_is_named(tmp_path) -> None:
    docs = [{"text": f"doc {i}"} for i in range(40)]
    tokenize(docs, tmp_path / "ft", validation_fraction=0.5)
    for split in ("train", "validation"):
        got = _cat(str(tmp_path / "ft"), "--split", split)
        assert got and all(x["split"] == split for x in got)


def test_records_keep_their_other_fields() -> None:
    from lmdata.inspect.decode import decoded_record

    def text_of(ids: np.ndarray) -> str:
        return bytes(int(i) - 1 for i in ids).decode()

    ids = np.array([98, 99], dtype=np.uint16)  # "ab" in the byte tokenizer
    assert decoded_record(3, {"tokens": ids, "n": 1}, text_of) == {"index": 3, "text": "ab", "n": 1}
    # a record with its own text: its token fields are decoded where they are
    assert decoded_record(0, {"text": "t", "ids": ids}, text_of, "train") == {
        "index": 0,
        "split": "train",
        "text": "t",
        "ids": "ab",
    }
    # a field named like ours: the record whole, under "record"
    assert decoded_record(0, {"index": 9, "tokens": ids}, text_of) == {
        "index": 0,
        "text": "ab",
        "record": {"index": 9},
    }
    assert decoded_record(1, [1, 2], text_of) == {"index": 1, "record": [1, 2]}
