"""Tokenizers behind one interface: bytes, HF tokenizer.json, tiktoken file, sentencepiece."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmdata.errors import InvalidInputError
from lmdata.tokenize import ByteTokenizer, load_tokenizer

BPE5K = Path(__file__).parents[1] / "data/modalities/tokenizers/bpe5k/tokenizer.json"
TEXTS = ["hello world", "", "unicode é 🙂", "hello hello hello world"]


@given(st.text())
def test_bytes_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode_batch([text])[0]
    assert (ids >= 1).all() and (ids <= 256).all()
    assert tok.decode(ids) == text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def test_hf_tokenizer_file():
    tok = load_tokenizer(str(BPE5K))
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(BPE5K))
    got = tok.encode_batch(TEXTS)
    assert [x.tolist() for x in got] == [ref.encode(t, add_special_tokens=False).ids for t in TEXTS]
    got = tok.encode_batch(TEXTS, add_special_tokens=True)  # the fast path keeps the specials
    assert [x.tolist() for x in got] == [ref.encode(t, add_special_tokens=True).ids for t in TEXTS]
    assert tok.token_id("<|endoftext|>") == ref.token_to_id("<|endoftext|>")
    assert load_tokenizer(str(BPE5K.parent)).spec == str(BPE5K)
    assert len(pickle.dumps(tok)) < 300  # shipped to workers by path, not by vocabulary


@pytest.fixture()
def tiktoken_file(tmp_path):
    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello", b" w"]
    f = tmp_path / "tiny.tiktoken"
    f.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    return f


def test_tiktoken_file(tiktoken_file):
    import tiktoken

    tok = load_tokenizer(str(tiktoken_file))
    ids = tok.encode_batch(["hello world"])[0].tolist()
    assert ids[0] == 259  # "hello" merged
    from tiktoken_ext.openai_public import r50k_pat_str

    merges = {b"he": 256, b"ll": 257, b"hell": 258, b"hello": 259, b" w": 260}
    enc = tiktoken.Encoding(
        "x",
        pat_str=r50k_pat_str,
        special_tokens={},
        mergeable_ranks={bytes([b]): b for b in range(256)} | merges,
    )
    assert ids == enc.encode_ordinary("hello world")
    assert tok.token_id("<|endoftext|>") == 261
    assert pickle.loads(pickle.dumps(tok)).encode_batch(["hello"])[0].tolist() == [259]


def test_sentencepiece_model(tmp_path):
    import sentencepiece as spm

    corpus = ["the quick brown fox jumps over the lazy dog"] * 50 + ["hello world"] * 50
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=40,
        model_type="bpe",
        minloglevel=2,
    )
    tok = load_tokenizer(str(tmp_path / "sp.model"))
    ref = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    assert [x.tolist() for x in tok.encode_batch(TEXTS[:2])] == ref.encode(TEXTS[:2])
    assert tok.vocab_size == 40
    assert tok.token_id("</s>") == ref.eos_id()


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(InvalidInputError, match="never downloads"):
        load_tokenizer("gpt2")  # a hub name is not fetched
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(InvalidInputError, match="unrecognised"):
        load_tokenizer(str(tmp_path / "x.bin"))
    (tmp_path / "bad.tiktoken").write_text("not base64 at all\n")
    with pytest.raises(InvalidInputError, match="tiktoken"):
        load_tokenizer(str(tmp_path / "bad.tiktoken"))


def test_pipeline_with_tiktoken_in_workers(tmp_path, tiktoken_file):
    import lmdata
    from lmdata.tokenize.pipeline import TokenizeJob, tokenize

    (tmp_path / "d.jsonl").write_text('{"text": "hello world"}\n{"text": "hell"}\n')
    tokenize(
        [tmp_path / "d.jsonl"],
        tmp_path / "o",
        TokenizeJob(to="flat-tokens", tokenizer=str(tiktoken_file)),
        workers=1,
    )
    assert [x.tolist() for x in lmdata.open(tmp_path / "o")] == [
        load_tokenizer(str(tiktoken_file)).encode_batch(["hello world"])[0].tolist(),
        [258],
    ]
    assert lmdata.open(tmp_path / "o").max_token_id == 260  # " w"


def test_the_special_tokens_listed_are_the_files(tmp_path):
    """What a loaded HF tokenizer lists (the provenance record's, with no second parse) is
    what the file's ``added_tokens`` mark special."""
    from tokenizers import AddedToken, Tokenizer

    from lmdata._provenance import _listed_special

    tok = Tokenizer.from_file(str(BPE5K))
    tok.add_special_tokens(["<|im_start|>", AddedToken("<|im_end|>", special=True)])
    tok.add_tokens(["not special", AddedToken("[[x]]", special=False)])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    listed = load_tokenizer(path).listed_special()
    assert listed == _listed_special(path)
    assert {"<|endoftext|>", "<|im_start|>", "<|im_end|>"} <= set(listed)
    assert "not special" not in listed and "[[x]]" not in listed
