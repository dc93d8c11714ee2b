"""The ``fast`` encoder: gigatoken (Rust, MIT; the ``lmdata[fast]`` extra) behind lmdata's
``Tokenizer`` interface, for the tokenizer files it implements exactly.

gigatoken loads byte-level BPE ``tokenizer.json`` files, SentencePiece BPE models with byte
fallback (``*.model``, or their ``tokenizer.json``) and tiktoken rank files. :func:`load_fast`
screens a file first and raises :class:`Unsupported`, with the reason, for what it does not
implement (Unigram, WordPiece, a normalizer or pre-tokenizer outside its set), so the job can
say why it stays on the reference encoder. Whatever it loads is still checked against the
reference before and during a job (:mod:`lmdata.tokenize.encoders`): this module only avoids
asking for what is known not to work.

Only ``gigatoken.gigatoken_rs`` is imported (its per-document ``encode`` returns numpy arrays;
its batch calls would import awkward, a second of start-up on a busy machine).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError

# what gigatoken's byte-level BPE implements (anything else: the reference encoder)
_NORMALIZERS = {None, "NFC"}
_PRE_TOKENIZERS = {"ByteLevel", "Split", "Sequence", "Digits"}
# tiktoken files: lmdata's name of the encoding -> gigatoken's pretokenizer scheme (others get
# the GPT-2 pattern in lmdata, so gigatoken's "gpt2")
_TIKTOKEN_SCHEMES = {"cl100k_base": "gpt4", "o200k_base": "o200k"}


class Unsupported(Exception):
    """The fast encoder does not implement this tokenizer (the message says why)."""


def available() -> bool:
    """Whether the fast encoder (gigatoken) is installed, without importing it."""
    from importlib.util import find_spec

    return find_spec("gigatoken") is not None


def version() -> str:
    """gigatoken's version, from its ``.dist-info`` folder beside the package (importing
    importlib.metadata and searching every path entry took 25 ms of a job's start-up)."""
    from importlib.util import find_spec

    spec = find_spec("gigatoken")
    for where in (spec and spec.submodule_search_locations) or ():
        for info in Path(where).parent.glob("gigatoken-*.dist-info"):
            return info.name[len("gigatoken-") : -len(".dist-info")]
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        return _v("gigatoken")
    except PackageNotFoundError:
        return "?"


def _rs() -> Any:
    from lmdata._deps import require

    return require("gigatoken.gigatoken_rs", "--encoder fast")


def _hf_config(path: Path, reference: Any = None) -> dict[str, Any]:
    """The parts of the ``tokenizer.json`` at ``path`` that :func:`_screen_hf` looks at (the
    model's type and options, the normalizer, the pre-tokenizer): asked of the Hugging Face
    tokenizer ``reference`` loaded from it when there is one (no second parse of the
    vocabulary), else read from the file."""
    import orjson

    tok = getattr(reference, "_tok", None)
    if tok is not None and hasattr(tok, "model"):
        m = tok.model
        model = {"type": type(m).__name__}
        for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"):
            model[k] = getattr(m, k, None)
        cfg: dict[str, Any] = {"model": model}
        try:
            for k in ("normalizer", "pre_tokenizer"):
                part = getattr(tok, k, None)
                cfg[k] = None if part is None else orjson.loads(part.__getstate__())
            return cfg
        except (AttributeError, TypeError, orjson.JSONDecodeError):
            pass  # a tokenizers version that does not say: the file does
    try:  # the reference loaded it already: a JSON file of sane size
        cfg = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise Unsupported(f"cannot read {path.name}: {e}") from None
    if not isinstance(cfg, dict):
        raise Unsupported(f"{path.name} is not a tokenizer.json object")
    return cfg


def _screen_hf(path: Path, reference: Any = None) -> bool:
    """Whether the ``tokenizer.json`` at ``path`` is one gigatoken implements; returns whether
    it is a SentencePiece-style BPE with byte fallback. Raises Unsupported naming what is
    not."""
    cfg = _hf_config(path, reference)
    model = cfg.get("model") or {}
    kind = model.get("type")
    if kind != "BPE":
        raise Unsupported(f"its model is {kind}, not BPE")
    if model.get("dropout"):
        raise Unsupported("BPE dropout is random")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Unsupported("subword prefixes/suffixes are not byte-level BPE")
    byte_fallback = bool(model.get("byte_fallback"))
    norm = cfg.get("normalizer")
    pre = cfg.get("pre_tokenizer")
    if byte_fallback:
        return True  # SentencePiece-style: gigatoken reads its normalizer and Metaspace itself
    names = _types(norm)
    if any(n not in _NORMALIZERS for n in names):
        raise Unsupported(f"the normalizer {'+'.join(map(str, names))} is not implemented")
    pnames = _types(pre)
    if "ByteLevel" not in pnames:
        raise Unsupported("its pre-tokenizer is not byte-level")
    bad = [n for n in pnames if n not in _PRE_TOKENIZERS]
    if bad:
        raise Unsupported(f"the pre-tokenizer {bad[0]} is not implemented")
    return False


def _types(component: Any) -> list[Any]:
    """The types of a normalizer / pre-tokenizer, flattening ``Sequence``."""
    if component is None:
        return []
    if not isinstance(component, dict):
        return ["?"]
    kind = component.get("type")
    if kind == "Sequence":
        inner = component.get("normalizers") or component.get("pretokenizers") or []
        return [t for c in inner for t in _types(c)] or []
    return [kind]


class FastTokenizer:
    """A tokenizer file encoded by gigatoken; ``reference`` is the lmdata tokenizer of the same
    file (ids are checked against it, and it answers ``token_id``/``decode``)."""

    encoder = "fast"

    def __init__(
        self, path: str | os.PathLike[str], reference: Any, pre: Preload | None = None
    ) -> None:
        self.spec = str(path)
        self.reference = reference
        self.vocab_size = reference.vocab_size
        self._backend = _load_backend(Path(path), reference, pre)
        self._encode = self._backend.encode
        # tiktoken encodes a text with lone surrogates as if each were U+FFFD; the others refuse
        self._replace_surrogates = Path(path).suffix == ".tiktoken"
        self._affixes: dict[bool, tuple[np.ndarray, np.ndarray]] = {}

    def affixes(self, add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        """The ids the reference puts before and after every text (its post-processor, BOS/EOS
        of a sentencepiece model) when ``add_special_tokens``; Unsupported if they vary."""
        if add_special_tokens not in self._affixes:
            empty = np.zeros(0, np.uint32)
            if not add_special_tokens:
                self._affixes[False] = (empty, empty)
            else:
                self._affixes[True] = _affixes_of(self.reference)
        return self._affixes[add_special_tokens]

    def encode_flat(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(the ids of all ``texts`` as one uint32 array, each text's number of ids)."""
        enc = self._encode
        try:
            arrays = [enc(t) for t in texts]
        except (TypeError, UnicodeError):
            if not self._replace_surrogates:
                raise
            arrays = [enc(_without_surrogates(t)) for t in texts]
        head, tail = self.affixes(add_special_tokens)
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        if len(head) or len(tail):
            arrays = [x for a in arrays for x in (head, a, tail)]
            lengths += len(head) + len(tail)
        if not arrays:
            return np.zeros(0, np.uint32), lengths
        return np.concatenate(arrays).astype(np.uint32, copy=False), lengths

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[np.ndarray]:
        flat, lengths = self.encode_flat(texts, add_special_tokens)
        return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []

    def token_id(self, token: str) -> int | None:
        return self.reference.token_id(token)

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        return self.reference.decode(ids, skip_special_tokens=skip_special_tokens)

    def __reduce__(self) -> tuple[Any, ...]:
        return (load_fast, (self.spec,))


def _without_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, as tiktoken does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _affixes_of(ref: Any) -> tuple[np.ndarray, np.ndarray]:
    """(prefix, suffix) ids such that ``ref(t, True) == prefix + ref(t, False) + suffix`` for
    every probe text; Unsupported when the post-processor does anything else."""
    found = None
    for t in ("a", "hello world", " x\n"):  # not "": where its ids go is ambiguous
        with_, plain = (
            ref.encode_batch([t], add_special_tokens=s)[0].tolist() for s in (True, False)
        )
        n = len(with_) - len(plain)
        for i in range(max(n, 0) + 1):
            if with_[i : i + len(plain)] == plain:
                pair = (tuple(with_[:i]), tuple(with_[i + len(plain) :]))
                break
        else:
            raise Unsupported("its post-processor changes the text's ids")
        if found is not None and pair != found:
            raise Unsupported("its post-processor adds different ids to different texts")
        found = pair
    assert found is not None
    return np.array(found[0], np.uint32), np.array(found[1], np.uint32)


class Preload:
    """The fast encoder's backend of the tokenizer file ``path``, built on a thread of its own
    while the caller loads the reference: both libraries parse the file without the GIL, so on
    two cores the job's start-up waits for one parse, not two. :func:`load_fast` takes the
    result once the reference has screened the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._backend: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lmdata-fast-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._backend = _build(self.path)
        except BaseException as e:  # handed to whoever asks for the result
            self._error = e

    def wait(self) -> None:
        """Until the thread is done (nothing forks while it parses)."""
        self._thread.join()

    def result(self) -> Any:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._backend


def preload(spec: Any) -> Preload | None:
    """Start building the fast encoder of the tokenizer file ``spec`` (a ``tokenizer.json``,
    ``*.tiktoken`` or ``*.model``, or a folder holding a ``tokenizer.json``), or None when
    gigatoken is not installed or ``spec`` is no such file."""
    if not isinstance(spec, (str, os.PathLike)) or spec == "bytes" or not available():
        return None
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.suffix not in (".json", ".tiktoken", ".model") or not path.is_file():
        return None
    return Preload(path)


def _load_backend(path: Path, reference: Any = None, pre: Preload | None = None) -> Any:
    """The backend of ``path``, screened first (through the loaded ``reference``); ``pre``: the
    one a :class:`Preload` builds."""
    _rs()  # MissingDependencyError when gigatoken is not installed
    if pre is not None and pre.path != path:
        pre.wait()  # another file (nothing forks while it parses): build this one here
        pre = None
    try:
        if path.suffix == ".json":
            try:
                _screen_hf(path, reference)
            except Unsupported:
                if pre is not None:
                    pre.wait()
                raise
        return pre.result() if pre is not None else _build(path)
    except Unsupported:
        raise
    except Exception as e:  # the Rust side raises ValueError / plain Exception
        raise Unsupported(f"gigatoken cannot load it ({' '.join(str(e).split())[:200]})") from None


def _build(path: Path) -> Any:
    """gigatoken's backend of the tokenizer file ``path`` (a tokenizer.json screened apart)."""
    rs = _rs()
    if path.suffix == ".tiktoken":
        name = path.name.split(".")[0]
        # no special tokens: tiktoken's encode_ordinary, which lmdata calls, splits none
        return rs.BPETokenizer.from_tiktoken(str(path), _TIKTOKEN_SCHEMES.get(name, "gpt2"))
    if path.suffix == ".model":
        import json

        from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json

        cfg = json.loads(sentencepiece_to_tokenizer_json(path.read_bytes()))
        # sentencepiece matches user-defined pieces in text, never control ones (<s>)
        cfg["added_tokens"] = [t for t in cfg["added_tokens"] if not t["special"]]
        return rs.load_hf_json(json.dumps(cfg, ensure_ascii=False))
    return rs.load_hf_json(path.read_bytes())


def load_fast(
    spec: str | os.PathLike[str], reference: Any = None, pre: Preload | None = None
) -> FastTokenizer:
    """The fast encoder of the tokenizer file ``spec`` (``pre``: its backend being built by
    :func:`preload`); Unsupported (with the reason) for a tokenizer it does not implement,
    MissingDependencyError when gigatoken is not installed."""
    from lmdata.tokenize.tokenizers import ByteTokenizer, load_tokenizer

    ref = reference if reference is not None else load_tokenizer(spec)
    if isinstance(ref, ByteTokenizer):
        raise Unsupported("the built-in byte tokenizer needs no other encoder")
    path = Path(ref.spec)
    if not path.is_file():
        raise InvalidInputError("tokenizer file not found", path=path)
    return FastTokenizer(path, ref, pre)
