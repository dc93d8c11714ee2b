"""modalities dataset views: the origin's sample counts and windows, and raw-JSONL documents."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from lmdata.errors import InvalidInputError
from lmdata.formats import modalities
from lmdata.formats.modalities import Writer
from lmdata.formats.modalities.views import (
    ContinuousView,
    JsonlTokenDocuments,
    MegatronView,
    megatron_starts,
)
from lmdata.formats.modalities_jsonl import build_index

DATA = Path(__file__).parent.parent / "data" / "modalities"


@pytest.fixture
def tokens20(tmp_path: Path) -> Path:
    """modalities' conftest dummy file: tokens 0..19, 4 bytes each, documents 6/10/3/1."""
    p = tmp_path / "t20.pbin"
    with Writer(p, token_width=4) as w:
        for a, b in [(0, 6), (6, 16), (16, 19), (19, 20)]:
            w.write(np.arange(a, b))
    return p


# (block size, reuse_last_target, samples) from modalities' test_packed_dataset.py
CONTINUOUS = [
    (2, True, 19),
    (3, True, 9),
    (10, True, 2),
    (6, True, 3),
    (20, True, 1),
    (2, False, 10),
    (6, False, 3),
]


@pytest.mark.parametrize(("block", "reuse", "count"), CONTINUOUS)
def test_continuous_counts_and_windows(tokens20: Path, block: int, reuse: bool, count: int) -> None:
    seq_len = block - 1 if reuse else block
    v = ContinuousView(tokens20, seq_len, reuse_last_target=reuse)
    assert len(v) == count
    stride = block - 1 if reuse else block
    expected = np.stack([np.arange(i * stride, i * stride + block) for i in range(count)])
    assert np.array_equal(v.batch(np.arange(count)), expected)
    assert np.array_equal(v[-1], expected[-1])
    assert [x.tolist() for x in v] == expected.tolist()
    if reuse:  # every token is a target exactly once
        assert len(v) == (20 - 1) // seq_len


@pytest.mark.parametrize(("seq_len", "reuse"), [(20, True), (21, False), (0, True), (1, False)])
def test_continuous_refuses_what_the_origin_refuses(
    tokens20: Path, seq_len: int, reuse: bool
) -> None:
    with pytest.raises(InvalidInputError):
        ContinuousView(tokens20, seq_len, reuse_last_target=reuse)


def test_continuous_ignores_the_index_and_casts(tokens20: Path) -> None:
    v = ContinuousView(str(tokens20), 4, dtype=np.int64)
    assert v.batch([0, 1]).dtype == np.int64
    v2 = pickle.loads(pickle.dumps(v))
    assert np.array_equal(v2.batch([3]), v.batch([3]))
    with pytest.raises(IndexError):
        v[len(v)]


# (block size, samples) for documents of 6, 10, 3 and 1 tokens, from modalities' tests
MEGATRON = [(1, 4), (2, 3), (3, 3), (6, 2), (10, 2), (20, 1), (25, 0)]


@pytest.mark.parametrize(("block", "count"), MEGATRON)
def test_megatron_counts_match_the_origin(tokens20: Path, block: int, count: int) -> None:
    v = MegatronView(tokens20, block)
    assert len(v) == count
    for s in v:  # tokens are 0..19, so a window's first token is its start
        assert s.tolist() == list(range(int(s[0]), int(s[0]) + block))


def test_megatron_windows_start_at_documents(tokens20: Path) -> None:
    # block 10: docs 6+10 overflow -> [0,10); the next starts at the 10-token document
    v = MegatronView(tokens20, 10)
    assert [s.tolist() for s in v] == [list(range(10)), list(range(6, 16))]
    assert megatron_starts(np.array([3, 3, 4]), 10).tolist() == [0]
    assert megatron_starts(np.array([4, 4, 4, 4]), 10).tolist() == [0]
    assert megatron_starts(np.array([4] * 6), 10).tolist() == [0, 8]
    assert megatron_starts(np.array([2, 25, 3, 9]), 10).tolist() == [0, 10]


def test_megatron_with_two_byte_tokens_reads_tokens_not_bytes(tmp_path: Path) -> None:
    # the origin reads block_size bytes, i.e. half a block of 2-byte tokens; we read tokens
    p = tmp_path / "two.pbin"
    with Writer(p, token_width=2) as w:
        w.write(np.arange(100, 110))
        w.write(np.arange(110, 115))
    v = MegatronView(p, 5)
    assert v[0].tolist() == [100, 101, 102, 103, 104]


def test_jsonl_token_documents(tmp_path: Path) -> None:
    from lmdata.tokenize.tokenizers import HFTokenizer

    jsonl = tmp_path / "docs.jsonl"
    shutil.copy(DATA / "docs.jsonl", jsonl)
    build_index(jsonl)
    tok = HFTokenizer(DATA / "tokenizers" / "bpe5k" / "tokenizer.json")
    docs = JsonlTokenDocuments(jsonl, tok)
    expected = json.loads((DATA / "expected_bpe5k.json").read_text())
    assert len(docs) == 300
    # no EOD is added: each document is the packed one minus its appended EOD
    packed = modalities.open(DATA / "docs_bpe5k.pbin")
    assert docs[0].tolist() == expected[0][:-1]
    assert docs[150].tolist() == packed[150].tolist()  # its text ends in the EOD string
    got = docs.take([1, 2])
    assert [g.tolist() for g in got] == [expected[1][:-1], expected[2][:-1]]
    jq_docs = JsonlTokenDocuments(jsonl, tok, jq_pattern=".text")
    assert jq_docs[0].tolist() == docs[0].tolist()
    assert pickle.loads(pickle.dumps(jq_docs))[3].tolist() == docs[3].tolist()
    with pytest.raises(InvalidInputError, match="document 0"):
        JsonlTokenDocuments(jsonl, tok, text_key="missing")[0]
