"""Modalities' data commands over lmdata: ``create_raw_index`` and ``pack_encoded_data`` with
modalities' own arguments and pack config, writing the files modalities 0.5.0 writes.

The pack config is read as modalities reads it (YAML with ``settings`` and a ``tokenizer``
component; paths relative to the working directory; ``${node_env:num_cpus}``). A key lmdata
does not implement is an error naming it. The queue sizes (``raw_samples_queue_size``,
``processed_samples_queue_size``) only tune the origin's process queues and have no effect
here; ``processing_batch_size`` sets lmdata's work-unit size, which never changes the output.

Packing reads the documents the raw index lists, in its order (an index may skip, repeat or
reorder lines, as modalities allows), and takes each one's text as the first result of
``jq_pattern``: a path of keys (``.text``, ``.meta.body``) is read directly, any other jq
program runs through the ``jq`` package, on the document's text as modalities runs it. Where
modalities drops a whole batch with a warning (and then silently truncates the output), a
document whose pattern gives no string is an error naming it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import orjson
import yaml

from lmdata._deps import require
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats.modalities_jsonl import (
    IndexResult,
    JsonlDocuments,
    build_index,
    default_index_path,
)
from lmdata.tokenize.pipeline import Summary, TokenizeJob, tokenize
from lmdata.tokenize.tokenizers import load_tokenizer

POLICIES = ("error", "skip", "override")
_SETTINGS = {
    "src_path",
    "dst_path",
    "index_path",
    "jq_pattern",
    "num_cpus",
    "eod_token",
    "processing_batch_size",
    "raw_samples_queue_size",
    "processed_samples_queue_size",
}
_REQUIRED = ("src_path", "jq_pattern", "eod_token", "processing_batch_size")
_POSITIVE = ("processing_batch_size", "raw_samples_queue_size", "processed_samples_queue_size")
_HF_KEYS = {
    "pretrained_model_name_or_path",
    "max_length",
    "truncation",
    "padding",
    "special_tokens",
}
_SP_KEYS = {"tokenizer_model_file"}
_KEY_PATH = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+\Z")  # .text, .meta.body
_ENV = re.compile(r"\$\{node_env:num_cpus\}\Z")


def _check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise InvalidInputError(f"file_existence_policy must be one of {', '.join(POLICIES)}")
    return policy


def _existing(path: Path, policy: str) -> bool:
    """True when the output exists and the policy says to leave it; raises under ``error``."""
    if not path.exists():
        return False
    if policy == "error":
        raise OutputExistsError(
            "file already exists (pass --file_existence_policy override or skip)", path=path
        )
    return policy == "skip"


def create_raw_index(
    src_path: str | os.PathLike[str],
    index_path: str | os.PathLike[str] | None = None,
    file_existence_policy: str = "error",
) -> IndexResult | None:
    """modalities' ``create_raw_index``: ``foo.jsonl`` -> ``foo.idx`` (None when skipped)."""
    _check_policy(file_existence_policy)
    src = Path(src_path)
    idx = Path(index_path) if index_path is not None else default_index_path(src)
    if idx.resolve() == src.resolve():
        raise InvalidInputError("index_path must differ from the source file", path=idx)
    if _existing(idx, file_existence_policy):
        return None
    idx.parent.mkdir(parents=True, exist_ok=True)
    return build_index(src, idx, overwrite=True)


@dataclass(frozen=True)
class PackConfig:
    """A ``pack_encoded_data`` config, resolved: what to read and write and how to tokenize."""

    src_path: Path
    dst_path: Path
    index_path: Path
    jq_pattern: str
    eod_token: str
    num_cpus: int
    batch_docs: int
    tokenizer: str

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> PackConfig:
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise InvalidInputError(f"cannot read the config: {e.strerror}", path=path) from None
        except yaml.YAMLError as e:
            raise InvalidInputError(f"the config is not valid YAML: {e}", path=path) from None
        try:
            return cls.from_dict(data)
        except InvalidInputError as e:
            raise InvalidInputError(str(e), path=path) from None

    @classmethod
    def from_dict(cls, data: Any) -> PackConfig:
        if not isinstance(data, dict):
            raise InvalidInputError("the config must be a mapping with settings and tokenizer")
        _no_unknown(data, {"settings", "tokenizer"}, "")
        s = data.get("settings")
        if not isinstance(s, dict):
            raise InvalidInputError("the config needs a `settings` mapping")
        _no_unknown(s, _SETTINGS, "settings.")
        for k in _REQUIRED:
            if s.get(k) is None:
                raise InvalidInputError(f"settings.{k} is required")
        for k in _POSITIVE:
            if k in s:
                _positive(s[k], f"settings.{k}")
        pattern = s["jq_pattern"]
        if not isinstance(pattern, str):
            raise InvalidInputError(f"settings.jq_pattern must be a jq program, got {pattern!r}")
        TextOf(pattern)  # a jq syntax error shows now, before any work
        cpus = s.get("num_cpus")
        if cpus is None or (isinstance(cpus, str) and _ENV.match(cpus)):
            cpus = os.cpu_count() or 1
        src = Path(s["src_path"])
        return cls(
            src_path=src,
            dst_path=Path(s["dst_path"]) if s.get("dst_path") else src.with_suffix(".pbin"),
            index_path=Path(s["index_path"]) if s.get("index_path") else default_index_path(src),
            jq_pattern=pattern,
            eod_token=str(s["eod_token"]),
            num_cpus=_positive(cpus, "settings.num_cpus"),
            batch_docs=int(s["processing_batch_size"]),
            tokenizer=_tokenizer(data.get("tokenizer")),
        )


def _no_unknown(d: dict[str, Any], known: set[str], prefix: str) -> None:
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise InvalidInputError(
            f"unknown config key {prefix}{unknown[0]} (lmdata implements {prefix or 'top-level '}"
            f"keys {', '.join(sorted(known))})"
        )


def _positive(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidInputError(f"{what} must be an integer >= 1, got {v!r}")
    return v


def _tokenizer(t: Any) -> str:
    """The tokenizer file a modalities tokenizer component names (never downloaded)."""
    if not isinstance(t, dict):
        raise InvalidInputError("the config needs a `tokenizer` component")
    _no_unknown(t, {"component_key", "variant_key", "config"}, "tokenizer.")
    if t.get("component_key", "tokenizer") != "tokenizer":
        raise InvalidInputError("tokenizer.component_key must be tokenizer")
    cfg = t.get("config") or {}
    variant = t.get("variant_key")
    if variant == "pretrained_sp_tokenizer":
        _no_unknown(cfg, _SP_KEYS, "tokenizer.config.")
        path = Path(str(cfg.get("tokenizer_model_file", "")))
        if not path.is_file():
            raise InvalidInputError(
                f"tokenizer.config.tokenizer_model_file {str(path)!r} not found"
            )
        return str(path)
    if variant != "pretrained_hf_tokenizer":
        raise InvalidInputError(
            f"tokenizer.variant_key {variant!r}: lmdata implements pretrained_hf_tokenizer "
            "and pretrained_sp_tokenizer"
        )
    _no_unknown(cfg, _HF_KEYS, "tokenizer.config.")
    if cfg.get("truncation") not in (None, False, "do_not_truncate"):
        raise InvalidInputError("tokenizer.config.truncation: lmdata packs whole documents")
    if cfg.get("padding") not in (None, False, "do_not_pad"):
        raise InvalidInputError("tokenizer.config.padding: packed data is never padded")
    name = Path(str(cfg.get("pretrained_model_name_or_path", "")))
    path = name / "tokenizer.json" if name.is_dir() else name
    if not path.is_file():
        raise InvalidInputError(
            f"tokenizer.config.pretrained_model_name_or_path {str(name)!r}: no local "
            "tokenizer.json there (lmdata never downloads; save the tokenizer to a folder)"
        )
    special = cfg.get("special_tokens") or {}
    if special:
        tok = load_tokenizer(str(path))
        missing = [v for v in dict(special).values() if tok.token_id(str(v)) is None]
        if missing:
            raise InvalidInputError(
                f"tokenizer.config.special_tokens: {missing[0]!r} is not in the vocabulary "
                "(modalities requires special tokens to exist already)"
            )
    return str(path)


_JQ_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


class TextOf:
    """modalities' text of a document: the first result of ``jq_pattern`` on its bytes.

    A path of keys (``.text``, ``.meta.body``) is evaluated here with jq's rules (a missing
    key or null gives null, indexing anything else but an object is an error), so it needs no
    jq; any other program runs through jq itself (the ``lmdata[jq]`` extra), so every result
    is the one jq gives.
    """

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.keys = pattern[1:].split(".") if _KEY_PATH.match(pattern) else None
        self._program: Any = None
        if self.keys is None:
            self._jq()

    def _jq(self) -> Any:
        if self._program is None:
            jq = require("jq", f"the jq program settings.jq_pattern {self.pattern!r}")
            try:
                self._program = jq.compile(self.pattern)
            except ValueError as e:
                detail = " ".join(str(e).split())
                raise InvalidInputError(
                    f"settings.jq_pattern {self.pattern!r} is not a valid jq program: {detail}"
                ) from None
        return self._program

    def __call__(self, raw: bytes) -> Any:
        """The pattern's first result (raises ValueError or StopIteration as jq does)."""
        if self.keys is None:
            return self._jq().input_text(raw.decode("utf-8")).first()
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:  # e.g. integers over 64 bits, which jq reads as floats
            try:
                value = json.loads(raw)
            except ValueError:  # not one JSON value: jq (when installed) decides, else an error
                if find_spec("jq") is None:
                    raise
                return self._jq().input_text(raw.decode("utf-8")).first()
        for key in self.keys:
            if isinstance(value, dict):
                value = value.get(key)
            elif value is not None:
                kind = _JQ_TYPES.get(type(value), "number")
                raise ValueError(f'Cannot index {kind} with "{key}"')
        return value if isinstance(value, str) else _as_jq(value)


def _as_jq(value: Any) -> Any:
    """``value`` with its numbers as jq holds them, IEEE doubles: an integer beyond 2**53
    becomes the nearest double (past the largest, that double), as jq gives it back."""
    if isinstance(value, bool) or not isinstance(value, int | list | dict):
        return value
    if isinstance(value, int):
        if -(2**53) <= value <= 2**53:
            return value
        try:
            return int(float(value))
        except OverflowError:
            return sys.float_info.max if value > 0 else -sys.float_info.max
    if isinstance(value, list):
        return [_as_jq(v) for v in value]
    return {k: _as_jq(v) for k, v in value.items()}


def _stage_texts(cfg: PackConfig, staged: Path) -> None:
    """The text of every document the index lists, in its order, as ``{"text": ...}`` lines."""
    text_of = TextOf(cfg.jq_pattern)
    with JsonlDocuments(cfg.src_path, index_path=cfg.index_path) as docs, open(staged, "wb") as f:
        for i in range(len(docs)):
            try:
                text = text_of(docs.raw(i))
                problem = None if isinstance(text, str) else f"gives {_json_type(text)}"
            except StopIteration:
                problem = "gives no result"
            except (ValueError, UnicodeDecodeError) as e:
                problem = f"fails: {' '.join(str(e).split())}"
            if problem is not None:
                raise InvalidInputError(
                    f"settings.jq_pattern {cfg.jq_pattern!r} {problem}, not a string; fix the "
                    f"document or the pattern (modalities would drop this document's batch "
                    f"and truncate the output)",
                    path=cfg.src_path,
                    position=f"index entry {i} (byte {int(docs.offsets[i])})",
                )
            f.write(orjson.dumps({"text": text}))
            f.write(b"\n")


def _json_type(v: Any) -> str:
    kind = _JQ_TYPES.get(type(v), "number")
    return kind if v is None else f"{'an' if kind[0] in 'ao' else 'a'} {kind}"


def pack_encoded_data(
    config_path: str | os.PathLike[str],
    file_existence_policy: str = "error",
    encoder: str = "auto",
) -> Summary | None:
    """modalities' ``pack_encoded_data``: the ``.pbin`` of the indexed JSONL file, byte for
    byte as modalities writes it (None when the policy skips an existing output); ``encoder``
    as for ``lmdata.tokenize`` (the bytes are the same for each)."""
    _check_policy(file_existence_policy)
    cfg = PackConfig.read(config_path)
    if not cfg.index_path.is_file():
        raise InvalidInputError(
            "the raw index is missing; run `lmdata modalities data create_raw_index` first",
            path=cfg.index_path,
        )
    if _existing(cfg.dst_path, file_existence_policy):
        return None
    cfg.dst_path.parent.mkdir(parents=True, exist_ok=True)
    job = TokenizeJob(
        to="modalities",
        tokenizer=cfg.tokenizer,
        text_key="text",
        eod=cfg.eod_token,
        batch_docs=cfg.batch_docs,
        writer_options={"manifest": False},  # the origin's file set (no lmdata manifest)
    )
    # the texts, in the index's order, go through lmdata's tokenize pipeline from a hidden
    # file beside the output (one sequential pass; tokenizing dominates the time)
    staged = cfg.dst_path.parent / f".{cfg.dst_path.name}.lmdata-texts.jsonl"
    try:
        _stage_texts(cfg, staged)
        summary = tokenize(
            [staged], cfg.dst_path, job, workers=cfg.num_cpus, overwrite=True, encoder=encoder
        )
    finally:
        staged.unlink(missing_ok=True)
    summary.output = str(cfg.dst_path)
    return summary
