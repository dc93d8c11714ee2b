"""The fast encoder's screen of a tokenizer.json: asked of the loaded reference, it says what
reading the file says."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdata.tokenize.fast import Unsupported, _screen_hf
from lmdata.tokenize.tokenizers import load_tokenizer


def _bpe(**options):
    from tokenizers import models

    if options.get("continuing_subword_prefix"):  # its merges join prefixed pieces
        return models.BPE({"a": 0, "##b": 1, "ab": 2}, [("a", "##b")], **options)
    vocab = {c: i for i, c in enumerate("abcdefgh")} | {"ab": 8, "abc": 9}
    return models.BPE(vocab, [("a", "b"), ("ab", "c")], **options)


KINDS = [
    "byte-level BPE",
    "NFC and digits",
    "byte fallback",
    "NFKC",
    "a normalizer sequence",
    "whitespace split",
    "metaspace beside byte-level",
    "subword prefix",
    "dropout",
    "WordPiece",
]


def _kinds():
    from tokenizers import models, normalizers, pre_tokenizers

    level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return {
        "byte-level BPE": (_bpe(), None, level),
        "NFC and digits": (
            _bpe(),
            normalizers.NFC(),
            pre_tokenizers.Sequence([pre_tokenizers.Digits(), level]),
        ),
        "byte fallback": (_bpe(byte_fallback=True), normalizers.NFKC(), None),
        "NFKC": (_bpe(), normalizers.NFKC(), level),
        "a normalizer sequence": (
            _bpe(),
            normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]),
            level,
        ),
        "whitespace split": (_bpe(), None, pre_tokenizers.Whitespace()),
        "metaspace beside byte-level": (
            _bpe(),
            None,
            pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), level]),
        ),
        "subword prefix": (_bpe(continuing_subword_prefix="##"), None, level),
        "dropout": (_bpe(dropout=0.1), None, level),
        "WordPiece": (models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"), None, level),
    }


@pytest.mark.parametrize("kind", KINDS)
def test_screening_the_loaded_reference_says_what_the_file_says(kind, tmp_path):
    from tokenizers import Tokenizer

    model, normalizer, pre = _kinds()[kind]
    tok = Tokenizer(model)
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre is not None:
        tok.pre_tokenizer = pre
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    ref = load_tokenizer(path)

    def outcome(reference):
        try:
            return _screen_hf(Path(path), reference)
        except Unsupported as e:
            return f"Unsupported: {e}"

    from_file = outcome(None)
    assert outcome(ref) == from_file
    supported = {"byte-level BPE", "NFC and digits", "byte fallback"}
    assert isinstance(from_file, bool) == (kind in supported), from_file
