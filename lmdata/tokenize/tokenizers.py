"""Tokenizers: a built-in byte-level one (the default) and local tokenizer files.

Nothing is ever fetched from a hub: a tokenizer is ``bytes`` or a path to a file on disk.
Each tokenizer pickles as its spec (a name or a path), so sending one to worker processes costs
a few bytes, not the vocabulary.
"""

from __future__ import annotations

import array
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lmdata.errors import InvalidInputError, MissingDependencyError

_U32_ARRAY = array.array("I").itemsize == 4  # C unsigned int is 32 bits (everywhere lmdata runs)


@runtime_checkable
class Tokenizer(Protocol):
    """What the pipeline needs from a tokenizer."""

    spec: str
    vocab_size: int

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[np.ndarray]:
        """Token ids of each text as integer arrays (special tokens only when asked)."""
        ...

    def token_id(self, token: str) -> int | None:
        """The id of a special token such as ``<|endoftext|>``, or None."""
        ...


class ByteTokenizer:
    """UTF-8 bytes shifted by one: byte ``b`` is id ``b + 1``, so id 0 stays free.

    That is seqax's ``bytes_utf8`` convention (flat-tokens reserves 0 for the input at each
    sequence start). Vocabulary 257, needs no file.
    """

    spec = "bytes"
    vocab_size = 257

    def encode(self, text: str) -> np.ndarray:
        b = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
        return b.astype(np.uint16) + 1

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; id 0 (no byte) is dropped, invalid UTF-8 becomes U+FFFD."""
        a = np.asarray(ids, dtype=np.int64)
        return (a[a > 0] - 1).astype(np.uint8).tobytes().decode("utf-8", "replace")

    def token_id(self, token: str) -> int | None:
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        return (ByteTokenizer, ())


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` file, through the tokenizers library."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            from tokenizers import Tokenizer as _T
        except ImportError:
            raise MissingDependencyError(
                "tokenizer.json files need `pip install tokenizers`"
            ) from None
        self.spec = str(path)
        try:
            self._tok = _T.from_file(self.spec)
        except Exception as e:  # the Rust side raises a plain Exception
            raise InvalidInputError(f"cannot load tokenizer: {e}", path=path) from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # what transformers' `tokenizer.vocab_size` reports (added tokens excluded); Modalities
        # derives its token width from this number
        self.base_vocab_size = self._tok.get_vocab_size(with_added_tokens=False)

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[np.ndarray]:
        # the same ids without character offsets, which tokenize never uses (tokenizers>=0.21)
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        encs = encode(list(texts), add_special_tokens=add_special_tokens)
        # through array.array: a third of numpy's cost per token converting a list of ints
        if _U32_ARRAY:
            return [np.frombuffer(array.array("I", e.ids), dtype=np.uint32) for e in encs]
        return [np.asarray(e.ids, dtype=np.uint32) for e in encs]

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def listed_special(self) -> dict[str, int]:
        """The special tokens the file lists in ``added_tokens`` (name -> id), as loaded: what
        the provenance record names, without parsing the file again."""
        added = self._tok.get_added_tokens_decoder()
        return {t.content: i for i, t in sorted(added.items()) if t.special and t.content}

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (special tokens shown unless ``skip_special_tokens``)."""
        return self._tok.decode(np.asarray(ids).tolist(), skip_special_tokens=skip_special_tokens)

    def __reduce__(self) -> tuple[Any, ...]:
        return (HFTokenizer, (self.spec,))


class TiktokenTokenizer:
    """A tiktoken BPE ranks file (``*.tiktoken``: one ``base64-token rank`` per line).

    A file named after an OpenAI encoding (``cl100k_base.tiktoken``, ``o200k_base``, ``r50k_base``,
    ``p50k_base``, ``gpt2``) gets that encoding's split pattern and special tokens from tiktoken
    itself; any other file gets the GPT-2 pattern and ``<|endoftext|>`` after the last rank.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import base64

        import tiktoken

        self.spec = str(path)
        ranks: dict[bytes, int] = {}
        try:
            for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):  # noqa: B007
                if line.strip():
                    tok, rank = line.split()
                    ranks[base64.b64decode(tok)] = int(rank)
        except (ValueError, OSError) as e:
            raise InvalidInputError(
                f"not a tiktoken BPE file ({e})", path=path, position=f"line {n}"
            ) from None
        name = Path(path).name.split(".")[0]
        pat, special = self._known(name, ranks)
        self._enc = tiktoken.Encoding(
            name, pat_str=pat, mergeable_ranks=ranks, special_tokens=special
        )
        self.vocab_size = self._enc.n_vocab

    @staticmethod
    def _known(name: str, ranks: dict[bytes, int]) -> tuple[str, dict[str, int]]:
        from tiktoken_ext import openai_public as op

        ctor = op.ENCODING_CONSTRUCTORS.get(name)
        if ctor is not None:
            real = op.load_tiktoken_bpe
            op.load_tiktoken_bpe = lambda *a, **k: ranks  # read nothing from the network
            try:
                spec = ctor()
            finally:
                op.load_tiktoken_bpe = real
            return spec["pat_str"], spec["special_tokens"]
        return op.r50k_pat_str, {"<|endoftext|>": max(ranks.values(), default=-1) + 1}

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[np.ndarray]:
        out = self._enc.encode_ordinary_batch(list(texts), num_threads=1)
        return [np.asarray(x, dtype=np.uint32) for x in out]

    def token_id(self, token: str) -> int | None:
        return self._enc._special_tokens.get(token)

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; bytes that are not UTF-8 become U+FFFD."""
        ids_list = np.asarray(ids).tolist()
        if skip_special_tokens:
            special = set(self._enc._special_tokens.values())
            ids_list = [i for i in ids_list if i not in special]
        return self._enc.decode(ids_list, errors="replace")

    def __reduce__(self) -> tuple[Any, ...]:
        return (TiktokenTokenizer, (self.spec,))


class SentencePieceTokenizer:
    """A sentencepiece ``*.model`` file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import sentencepiece as spm

        self.spec = str(path)
        try:
            self._sp = spm.SentencePieceProcessor(model_file=self.spec)
        except (OSError, RuntimeError) as e:
            raise InvalidInputError(f"cannot load sentencepiece model: {e}", path=path) from None
        self.vocab_size = self._sp.get_piece_size()

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[np.ndarray]:
        ids = self._sp.encode(list(texts), add_bos=add_special_tokens, add_eos=add_special_tokens)
        return [np.asarray(x, dtype=np.uint32) for x in ids]

    def token_id(self, token: str) -> int | None:
        i = self._sp.piece_to_id(token)
        return None if i == self._sp.unk_id() and token != self._sp.id_to_piece(i) else i

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (sentencepiece drops control pieces such as BOS/EOS itself)."""
        return self._sp.decode(np.asarray(ids).tolist())

    def __reduce__(self) -> tuple[Any, ...]:
        return (SentencePieceTokenizer, (self.spec,))


def load_tokenizer(spec: str | os.PathLike[str] | Tokenizer | None) -> Tokenizer:
    """``None``/``"bytes"``: the byte tokenizer; a path: ``*.json`` (or a folder holding
    ``tokenizer.json``) a Hugging Face tokenizer, ``*.tiktoken`` a tiktoken BPE file,
    ``*.model`` a sentencepiece model."""
    if spec is None or spec == "bytes":
        return ByteTokenizer()
    if isinstance(spec, Tokenizer):
        return spec
    p = Path(spec)
    if not p.exists():
        raise InvalidInputError(
            "tokenizer file not found (lmdata never downloads tokenizers; pass a local "
            "tokenizer.json, or 'bytes')",
            path=p,
        )
    if p.is_dir() and (p / "tokenizer.json").is_file():
        p = p / "tokenizer.json"
    if p.suffix == ".json":
        return HFTokenizer(p)
    if p.suffix == ".tiktoken":
        return TiktokenTokenizer(p)
    if p.suffix == ".model":
        return SentencePieceTokenizer(p)
    raise InvalidInputError(
        "unrecognised tokenizer file; use 'bytes', a tokenizer.json, a *.tiktoken BPE file "
        "or a sentencepiece *.model",
        path=p,
    )
