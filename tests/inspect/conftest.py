"""A small byte-level BPE tokenizer trained in the test session (nothing downloaded)."""

from __future__ import annotations

import pytest

CORPUS = [
    "hello world, héllo wörld, 日本語のテキスト",
    "<script>alert('x')</script> & <b>bold</b>",
    "the quick brown fox jumps over the lazy dog\n\ttabs and  spaces",
] * 20


@pytest.fixture(scope="session")
def bpe_file(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path
