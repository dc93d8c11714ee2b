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


# ---- the backend built on a thread while the reference loads -------------------------------------


def _saved(kind: str, path: Path) -> Path:
    """A tokenizer.json in the folder ``path``: a byte-level BPE trained here (every byte has
    an id, as gigatoken needs), or one of KINDS."""
    from tokenizers import Tokenizer, pre_tokenizers, trainers

    if kind == "trained":
        tok = Tokenizer(_bpe())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(["a bad cafe faced a dead cab"] * 20, trainer)
    else:
        model, normalizer, pre = _kinds()[kind]
        tok = Tokenizer(model)
        if normalizer is not None:
            tok.normalizer = normalizer
        if pre is not None:
            tok.pre_tokenizer = pre
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"


def test_the_preloaded_backend_is_the_one_the_fast_encoder_encodes_with(tmp_path):
    from lmdata.tokenize.fast import load_fast, preload

    path = _saved("trained", tmp_path)
    pre = preload(tmp_path)  # a folder holding a tokenizer.json
    assert pre is not None and pre.path == path
    fast = load_fast(path, load_tokenizer(path), pre)
    assert fast._backend is pre.result()
    texts = ["abc abcd", "hgfedcba", ""]
    plain = load_fast(path)
    assert [a.tolist() for a in fast.encode_batch(texts)] == [
        a.tolist() for a in plain.encode_batch(texts)
    ]


def test_nothing_is_preloaded_for_what_the_fast_encoder_cannot_read(tmp_path):
    from lmdata.tokenize.fast import preload

    (tmp_path / "vocab.txt").write_text("a\n")
    assert preload("bytes") is None
    assert preload(tmp_path / "vocab.txt") is None
    assert preload(tmp_path / "missing.json") is None
    assert preload(tmp_path) is None  # a folder without a tokenizer.json


def test_an_unsupported_file_waits_for_its_preload_before_saying_why(tmp_path):
    from lmdata.tokenize.fast import load_fast, preload

    path = _saved("WordPiece", tmp_path)
    pre = preload(path)
    assert pre is not None
    with pytest.raises(Unsupported, match="WordPiece"):
        load_fast(path, load_tokenizer(path), pre)
    assert not pre._thread.is_alive()  # nothing forks while it parses


def test_a_job_builds_the_fast_encoder_once_on_its_own_thread(tmp_path, monkeypatch):
    import threading

    import lmdata
    from lmdata.tokenize import fast

    path = _saved("trained", tmp_path / "tok")
    built: list[str] = []
    real = fast._build

    def counted(p):
        built.append(threading.current_thread().name)
        return real(p)

    monkeypatch.setattr(fast, "_build", counted)
    s = lmdata.tokenize(
        iter(["abc", "bad cafe"]), tmp_path / "out", to="flat-tokens", tokenizer=path
    )
    assert s.encoder.startswith("fast")
    assert built == ["lmdata-fast-load"]


def test_the_version_is_the_installed_distributions():
    from importlib.metadata import version as installed

    from lmdata.tokenize.fast import version

    assert version() == installed("gigatoken")


def test_a_local_job_imports_nothing_it_does_not_use(tmp_path):
    """Start-up: a local fast job to uncompressed flat-tokens never imports asyncio (object
    stores), numcodecs (compression) or importlib.metadata (gigatoken's version)."""
    import subprocess
    import sys

    tok = _saved("trained", tmp_path / "tok")
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "a bad cafe"}\n{"text": "faced a dead cab"}\n')
    code = (
        "import sys, lmdata\n"
        f"s = lmdata.tokenize([{str(src)!r}], {str(tmp_path / 'out')!r}, to='flat-tokens', "
        f"tokenizer={str(tok)!r}, workers=0)\n"
        "print(s.encoder.split()[0], sorted({'asyncio', 'numcodecs', 'importlib.metadata'} "
        "& set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["fast", "[]"]


def test_the_fast_encoder_encodes_on_the_workers_own_thread(tmp_path, monkeypatch):
    """Its per-document calls hold the GIL: a thread of its own would only take turns with the
    parser (the reference, which releases the GIL, keeps its thread)."""
    import threading

    import lmdata
    from lmdata.tokenize.fast import FastTokenizer

    tok = _saved("trained", tmp_path / "tok")
    where: list[str] = []
    real = FastTokenizer.encode_flat

    def recorded(self, texts, add_special_tokens=False):
        where.append(threading.current_thread().name)
        return real(self, texts, add_special_tokens)

    monkeypatch.setattr(FastTokenizer, "encode_flat", recorded)
    docs = iter(f"a bad cafe {i}" for i in range(600))
    s = lmdata.tokenize(docs, tmp_path / "out", to="flat-tokens", tokenizer=tok, batch_docs=100)
    assert s.encoder.startswith("fast") and s.documents_written == 600
    assert where and set(where) == {threading.current_thread().name}
