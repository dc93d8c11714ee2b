"""Where a token dataset came from: the tokenizer that made it, the lmdata version and command.

Every token dataset lmdata tokenizes records this, where its format has room without breaking
the origin tool: flat-tokens in the root group's zarr attributes (seqax reads only the split
groups), MDS as a key of ``index.json`` (streaming reads only ``shards`` and ``version``),
Atlas in a file ``lmdata.json`` beside its root ``meta.json`` (the origin opens folders only),
Modalities ``.pbin`` in a sidecar ``<file>.lmdata.json`` (the file format has no room). Each
format's ``info`` returns it under ``"provenance"``; ``lmdata cat --decode`` finds the
tokenizer file through it.

The record is untrusted input when read back: :func:`parse` keeps only known keys of the
expected types, so a hand-edited file never reaches a caller as anything but plain values.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmdata._redact import redact_command
from lmdata._version import __version__

KEY = "lmdata"  # the key holding the record in zarr attributes and index.json
FILE = "lmdata.json"  # the record's file inside a dataset folder (Atlas)
SIDECAR_SUFFIX = ".lmdata.json"  # the record's file beside a one-file dataset (Modalities)
VERSION = 1
MAX_BYTES = 4 << 20  # a record with every special token of a large vocabulary stays far below
MAX_SPECIAL = 1024  # special tokens recorded (Llama 3 has 256)
_MAX_TOKENIZER_BYTES = 1 << 30  # a tokenizer.json larger than this is not listed

# special tokens looked up by name in tokenizers whose files do not list them
_KNOWN_SPECIAL = (
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|padding|>",
    "<s>",
    "</s>",
    "<unk>",
    "<pad>",
    "<bos>",
    "<eos>",
    "[CLS]",
    "[SEP]",
    "[PAD]",
    "[UNK]",
    "[MASK]",
)

_COMMAND: ContextVar[str | None] = ContextVar("lmdata_command", default=None)
_UNSAVED: ContextVar[str | None] = ContextVar("lmdata_unsaved_tokenizer", default=None)


@contextlib.contextmanager
def command_scope(command: str | Sequence[str], *, outermost: bool = False) -> Iterator[None]:
    """Record ``command`` (a command line's arguments, or the text of a library call) as what
    made the datasets written inside the ``with`` block, with its secrets masked (storage
    options, URL userinfo, tokens: :func:`lmdata._redact.redact_command`); with
    ``outermost``, only when no enclosing block set one (the CLI's line wins over the call of
    the library function it makes)."""
    outer = _COMMAND.get()
    token = _COMMAND.set(outer if outermost and outer else redact_command(command))
    try:
        yield
    finally:
        _COMMAND.reset(token)


@contextlib.contextmanager
def unsaved_tokenizer(path: str | None) -> Iterator[None]:
    """Inside the block, the tokenizer file at ``path`` is a temporary copy of an object
    (``lmdata.tokenize(..., tokenizer=obj)``): records keep its name and hash, not its path,
    so a reader looks for the file beside the dataset rather than where it briefly was."""
    token = _UNSAVED.set(str(Path(path).resolve()) if path else None)
    try:
        yield
    finally:
        _UNSAVED.reset(token)


def current_command() -> str:
    """The command being run, secrets masked: what :func:`command_scope` set, else this
    process's argv."""
    cmd = _COMMAND.get()
    if cmd is not None:
        return cmd
    return redact_command(["python", *sys.argv]) if sys.argv and sys.argv[0] else "python"


@dataclass(frozen=True)
class TokenizerRecord:
    """The tokenizer of a dataset: enough to find its file again and to size a model."""

    kind: str  # bytes, huggingface, tiktoken, sentencepiece (or the class name)
    vocab_size: int | None
    name: str | None = None  # file name
    path: str | None = None  # absolute path where it was when the dataset was written
    sha256: str | None = None  # of the file's bytes
    eod_id: int | None = None  # appended after every document by lmdata (None: nothing)
    bos_id: int | None = None  # put before every document by the tokenizer's post-processor
    special_tokens_added: bool = False  # whether the post-processor's tokens were added
    special_tokens: dict[str, int] = field(default_factory=dict)
    encoder: str | None = None  # what encoded with it: "fast (gigatoken 0.10.0)", "hf"


@dataclass(frozen=True)
class Provenance:
    """What made a token dataset."""

    tokenizer: TokenizerRecord
    lmdata_version: str
    command: str

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _kind(tok: Any, path: Path | None) -> str:
    if getattr(tok, "spec", None) == "bytes":
        return "bytes"
    suffix = path.suffix if path is not None else ""
    return {".json": "huggingface", ".tiktoken": "tiktoken", ".model": "sentencepiece"}.get(
        suffix, type(tok).__name__
    )


def _listed_special(path: Path) -> dict[str, int]:
    """The special tokens a Hugging Face ``tokenizer.json`` lists in ``added_tokens``.

    Read with orjson alone (a 32k vocabulary in 20 ms; ``lmdata._json``'s exact path, taken
    for the long digit runs vocabularies hold, costs ten times that): only the added tokens'
    names and small ids are used, which no integer beyond 64 bits can change."""
    import orjson

    try:
        if path.stat().st_size > _MAX_TOKENIZER_BYTES:
            return {}
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):  # the tokenizer loaded: this is only a listing
        return {}
    if not isinstance(obj, dict):
        return {}
    out: dict[str, int] = {}
    for t in obj.get("added_tokens") or []:
        if isinstance(t, dict) and t.get("special") and isinstance(t.get("content"), str):
            if isinstance(t.get("id"), int):
                out[t["content"]] = t["id"]
    return out


def _bos(tok: Any) -> int | None:
    """The id the tokenizer's post-processor puts before a text, if it puts one."""
    try:
        with_special, plain = (
            tok.encode_batch(["a"], add_special_tokens=s)[0].tolist() for s in (True, False)
        )
    except Exception:
        return None
    # text alone, text + EOS: no BOS; BOS + text (+ EOS): the first id
    if len(with_special) > len(plain) and with_special[: len(plain)] != plain:
        return int(with_special[0])
    return None


def describe_tokenizer(
    tok: Any, eod_id: int | None, special_tokens_added: bool, encoder: str | None = None
) -> TokenizerRecord:
    """The record of an lmdata tokenizer (see :mod:`lmdata.tokenize.tokenizers`)."""
    spec = getattr(tok, "spec", None)
    path = Path(spec).resolve() if isinstance(spec, str) and spec != "bytes" else None
    if path is not None and not path.is_file():
        path = None
    special: dict[str, int] = {}
    if path and path.suffix == ".json":
        listed = getattr(tok, "listed_special", None)  # a loaded tokenizer says: no parse
        special = dict(listed()) if callable(listed) else _listed_special(path)
    token_id = getattr(tok, "token_id", None)
    if callable(token_id):
        for name in _KNOWN_SPECIAL:
            if name not in special:
                i = token_id(name)
                if isinstance(i, int) and i >= 0:
                    special[name] = i
    special = dict(sorted(special.items(), key=lambda kv: kv[1])[:MAX_SPECIAL])
    vocab = getattr(tok, "vocab_size", None)
    return TokenizerRecord(
        kind=_kind(tok, path),
        vocab_size=int(vocab) if isinstance(vocab, int) else None,
        name=path.name if path else None,
        path=str(path) if path and str(path) != _UNSAVED.get() else None,
        sha256=file_sha256(path) if path else None,
        eod_id=eod_id,
        bos_id=_bos(tok) if special_tokens_added else None,
        special_tokens_added=special_tokens_added,
        special_tokens=special,
        encoder=encoder,
    )


def record(
    tok: Any, eod_id: int | None, special_tokens_added: bool, encoder: str | None = None
) -> dict[str, Any]:
    """The JSON record a token writer stores for a dataset made by ``tok`` now (encoded by
    ``encoder``)."""
    return Provenance(
        tokenizer=describe_tokenizer(tok, eod_id, special_tokens_added, encoder),
        lmdata_version=__version__,
        command=current_command(),
    ).to_json()


def carried(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record of a dataset made from one that records ``found`` (convert, merge, an
    append): the same tokenizer, this command and lmdata version; None without one."""
    if not isinstance(found, dict) or not isinstance(found.get("tokenizer"), dict):
        return None
    return {
        "version": VERSION,
        "tokenizer": dict(found["tokenizer"]),
        "lmdata_version": __version__,
        "command": current_command(),
    }


# what tells two tokenizer records apart (where a file was, and which encoder ran, do not)
_SAME = ("kind", "vocab_size", "name", "sha256", "eod_id", "bos_id", "special_tokens_added")


def joined(found: Sequence[dict[str, Any] | None], names: Sequence[str]) -> dict[str, Any] | None:
    """The record of a dataset joined from inputs ``names`` that record ``found``: their one
    tokenizer. Inputs made with different tokenizers are an InvalidInputError (their ids
    would mean different things in one dataset); inputs that record none are taken to share
    it, with a warning."""
    import warnings

    from lmdata.errors import InvalidInputError

    have = [(n, f) for n, f in zip(names, found, strict=True) if carried(f) is not None]
    if not have:
        return None
    first_name, first = have[0]
    key = [first["tokenizer"].get(k) for k in _SAME]
    for name, f in have[1:]:
        assert f is not None
        if [f["tokenizer"].get(k) for k in _SAME] != key:
            raise InvalidInputError(
                f"{name} was tokenized with another tokenizer than {first_name} "
                f"({f['tokenizer'].get('name') or f['tokenizer'].get('kind')} vs "
                f"{first['tokenizer'].get('name') or first['tokenizer'].get('kind')}); "
                "merge datasets made with one tokenizer (tokenize the others again)"
            )
    if len(have) < len(found):
        missing = [n for n, f in zip(names, found, strict=True) if carried(f) is None]
        warnings.warn(
            f"{', '.join(missing)} record no tokenizer; the merged dataset records that of "
            f"{first_name}",
            stacklevel=3,
        )
    return carried(first)


# ---- reading back ----------------------------------------------------------------------------


def _max_ids(d: Any) -> Iterator[int]:
    """Every ``max_token_id`` in a summary (per split for flat-tokens)."""
    if isinstance(d, dict):
        for k, v in d.items():
            if k == "max_token_id" and isinstance(v, int) and not isinstance(v, bool):
                yield v
            elif k != "provenance":
                yield from _max_ids(v)


def model_vocab_size(summary: dict[str, Any]) -> int | None:
    """The smallest vocabulary (embedding rows) a model trained on a dataset needs, from its
    ``lmdata.info`` summary: the recorded tokenizer's vocabulary, or more if the dataset holds
    larger ids; None when neither is known."""
    prov = summary.get("provenance") or {}
    vocab = (prov.get("tokenizer") or {}).get("vocab_size")
    sizes = [m + 1 for m in _max_ids(summary)] + ([vocab] if isinstance(vocab, int) else [])
    return max(sizes) if sizes else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def parse(obj: Any) -> dict[str, Any] | None:
    """A stored record as plain JSON values with only the known keys, or None if ``obj`` is
    not one (then the dataset is treated as having no provenance)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("tokenizer"), dict):
        return None
    t = obj["tokenizer"]
    special = t.get("special_tokens")
    tokenizer = {
        "kind": _str(t.get("kind")) or "unknown",
        "vocab_size": _int(t.get("vocab_size")),
        "name": _str(t.get("name")),
        "path": _str(t.get("path")),
        "sha256": _str(t.get("sha256")),
        "eod_id": _int(t.get("eod_id")),
        "bos_id": _int(t.get("bos_id")),
        "special_tokens_added": t.get("special_tokens_added") is True,
        "special_tokens": {
            k: v
            for k, v in (special.items() if isinstance(special, dict) else ())
            if isinstance(k, str) and _int(v) is not None
        },
        "encoder": _str(t.get("encoder")),
    }
    column = _str(obj.get("token_column"))  # record formats (MDS, Atlas): the token ids'
    return {
        "version": _int(obj.get("version")),
        "tokenizer": tokenizer,
        **({"token_column": column} if column is not None else {}),
        "lmdata_version": _str(obj.get("lmdata_version")),
        # masked again when read: a dataset written before lmdata masked secrets, or by hand
        "command": redact_command(c) if (c := _str(obj.get("command"))) is not None else None,
    }


def dumps(obj: dict[str, Any]) -> bytes:
    """A record as the bytes of a JSON file (sorted keys, indented: people read these)."""
    import json

    return json.dumps({KEY: obj}, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"


def _stored(store: Any, key: str) -> Any:
    """The value under :data:`KEY` in the JSON file ``key`` of ``store`` (written by
    :func:`dumps`), or None when the file is missing, unreadable, too large or not JSON."""
    from lmdata import _json
    from lmdata.errors import LmdataError

    try:
        data = store.read(key, MAX_BYTES + 1)
        obj = _json.from_bytes(data, path=store.url(key), what="provenance", max_bytes=MAX_BYTES)
    except (OSError, LmdataError):  # an oversized file is UnsafeDataError from the read
        return None
    return obj.get(KEY)


def read_file(store: Any, key: str) -> dict[str, Any] | None:
    """The record in the file ``key`` of ``store`` (Atlas's ``lmdata.json``), or None."""
    return parse(_stored(store, key))


def write_sidecar(store: Any, key: str, obj: dict[str, Any]) -> None:
    """Store the record of the one-object dataset ``key`` beside it, with the dataset's size
    (a later dataset written over ``key`` by another tool leaves a sidecar that no longer
    matches, which :func:`read_sidecar` then ignores)."""
    obj = {**obj, "dataset_bytes": store.size(key)}
    out = store.output(key + SIDECAR_SUFFIX, directory=False, overwrite=True)
    try:
        out.write("", dumps(obj))
    except BaseException:
        out.abort()
        raise
    out.commit()


def remove_sidecar(store: Any, key: str) -> None:
    """Drop the sidecar of ``key`` (before a new dataset replaces it)."""
    with contextlib.suppress(OSError):
        store.remove(key + SIDECAR_SUFFIX)


def read_sidecar(store: Any, key: str) -> dict[str, Any] | None:
    """The record beside the one-object dataset ``key``, if it is there and still matches."""
    inner = _stored(store, key + SIDECAR_SUFFIX)
    if not isinstance(inner, dict):
        return None
    try:
        if inner.get("dataset_bytes") != store.size(key):
            return None  # stale: another dataset was written over ``key``
    except OSError:
        return None
    return parse(inner)
