"""lmdata.decode and the per-token pieces the viewer shows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import InvalidInputError
from lmdata.inspect import pieces
from lmdata.tokenize import ByteTokenizer, load_tokenizer

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)


@given(TEXT)
def test_bytes_round_trip_and_pieces_cover_the_text(text):
    ids = ByteTokenizer().encode(text)
    assert lmdata.decode(ids, "bytes") == text
    parts = pieces(ids, "bytes")
    assert "".join(p for _, p in parts) == text
    assert [i for ids_, _ in parts for i in ids_] == ids.tolist()
    # a piece never shows half a character: every piece is whole UTF-8 characters
    assert all("\ufffd" not in p for _, p in parts)


@settings(max_examples=50, deadline=None)
@given(TEXT)
def test_hf_round_trip_and_pieces(bpe_file, text):
    tok = load_tokenizer(bpe_file)
    ids = tok.encode_batch([text])[0]
    assert lmdata.decode(ids, bpe_file) == text
    assert lmdata.decode(ids, str(bpe_file)) == text
    assert "".join(p for _, p in pieces(ids, tok)) == text


def test_hf_tokenizer_object_and_special_tokens(bpe_file):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(bpe_file))
    eod = raw.token_to_id("<|endoftext|>")
    ids = [*raw.encode("hello").ids, eod]
    assert lmdata.decode(ids, raw) == "hello<|endoftext|>"
    assert lmdata.decode(ids, bpe_file, skip_special_tokens=True) == "hello"


def test_batches_decode_row_by_row():
    batch = np.array([[105, 106], [107, 108]], dtype=np.uint32)  # a Loader batch's targets
    assert lmdata.decode(batch) == ["hi", "jk"]
    assert lmdata.decode([[105], [106, 106]]) == ["h", "ii"]
    assert lmdata.decode([]) == ""


def test_ids_outside_the_vocabulary_are_an_error(bpe_file):
    with pytest.raises(InvalidInputError, match="outside the tokenizer's vocabulary"):
        lmdata.decode([300], "bytes")
    with pytest.raises(InvalidInputError, match="outside"):
        lmdata.decode([-1], "bytes")
    with pytest.raises(InvalidInputError, match="tokenizer file not found"):
        lmdata.decode([1], "missing-tokenizer.json")
    with pytest.raises(InvalidInputError, match="decode"):
        lmdata.decode([1], 42)


def test_tiktoken_and_multibyte_merge(tmp_path):
    import base64

    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll"]
    f = tmp_path / "tiny.tiktoken"
    f.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    tok = load_tokenizer(f)
    text = "hello é 日本"
    ids = tok.encode_batch([text])[0]
    assert lmdata.decode(ids, f) == text
    parts = pieces(ids, tok)
    assert "".join(p for _, p in parts) == text
    assert ["日" == p for _, p in parts].count(True) == 1  # three byte tokens, one piece


def test_the_tokenizer_of_a_dataset(tmp_path):
    from lmdata.inspect.decode import dataset_tokenizer

    def made_with(**t):
        return {"path": str(tmp_path / "ds"), "provenance": {"tokenizer": t}}

    assert dataset_tokenizer({}, None) == (None, None, None)
    with pytest.raises(InvalidInputError, match="does not record the tokenizer"):
        dataset_tokenizer({}, None, required=True)
    tok, name, note = dataset_tokenizer(made_with(kind="bytes"), None)
    assert name == "bytes" and note is None and tok.decode([105, 106]) == "hi"
    gone = made_with(kind="huggingface", name="t.json", path=str(tmp_path / "t.json"), sha256="0")
    tok, name, note = dataset_tokenizer(gone, None)
    assert tok is None and "not found unchanged" in note and str(tmp_path / "t.json") in note
    with pytest.raises(InvalidInputError, match="not found unchanged"):
        dataset_tokenizer(gone, None, required=True)
    tok, name, note = dataset_tokenizer(gone, "bytes")  # given by hand: used, with a warning
    assert name == "bytes" and note.startswith("warning: the dataset was made with")
