"""Taggers: the built-in ones that need no downloads, the registry, and user taggers.

A tagger is a class with a ``name`` and a ``predict(doc) -> iterable of Span`` method, where
``doc`` is the document dict (``id``, ``text``, ``source``, ``metadata``...). Write one in a
file and pass it to ``lmdata tag --tagger-modules my_taggers.py``::

    from lmdata.dolma.taggers import Span, Tagger, register

    @register
    class Shouting(Tagger):
        name = "shouting_v1"

        def predict(self, doc):
            text = doc["text"]
            return [Span(0, len(text), "upper", sum(c.isupper() for c in text) / max(1, len(text)))]

Outputs are grouped as dolma does: key ``<experiment>__<tagger>__<type>`` (each part with
characters outside ``[A-Za-z0-9_]`` replaced by ``_``), value ``[[start, end, score], ...]``
with character offsets and scores rounded to 5 decimals; types without spans are left out
unless the tagger lists them in ``defaults`` (then they are ``[]``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import xxhash

from lmdata.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class Span:
    """``text[start:end]`` (code points) has ``score`` for ``type``."""

    start: int
    end: int
    type: str
    score: float = 1.0


class Tagger:
    """Optional base class: set ``name``, implement :meth:`predict`."""

    name: ClassVar[str] = ""
    defaults: ClassVar[tuple[str, ...]] = ()

    def predict(self, doc: dict[str, Any]) -> Iterable[Span]:
        raise NotImplementedError


REGISTRY: dict[str, type] = {}


def register(cls: type | None = None, *, name: str | None = None) -> Any:
    """Class decorator adding a tagger to the registry (under ``name`` or ``cls.name``)."""

    def add(c: type) -> type:
        key = name or getattr(c, "name", "")
        if not key or not callable(getattr(c, "predict", None)):
            raise InvalidInputError(
                f"tagger class {c.__name__} needs a `name` and a `predict(doc)` method"
            )
        old = REGISTRY.get(key)
        if old is not None and (old.__module__, old.__qualname__) != (c.__module__, c.__qualname__):
            raise InvalidInputError(
                f"two taggers are named {key!r} ({old.__module__}."
                f"{old.__qualname__} and {c.__module__}.{c.__qualname__})"
            )
        REGISTRY[key] = c
        return c

    return add(cls) if cls is not None else add


_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def make_variable_name(name: str) -> str:
    """dolma's key sanitizer: every character outside ``[A-Za-z0-9_]`` becomes ``_``."""
    return _UNSAFE.sub("_", name)


@functools.lru_cache(maxsize=4096)
def _key(experiment: str, tagger: str, typ: str) -> str:
    """The output key of one span type (a handful per job, so computed once each)."""
    return "__".join(map(make_variable_name, (experiment, tagger, typ)))


def group_output(
    spans: Iterable[Any], experiment: str, tagger: str, defaults: Iterable[str] = ()
) -> dict[str, list[list[Any]]]:
    """dolma's output grouping for one tagger and one document."""
    out: dict[str, list[list[Any]]] = {_key(experiment, tagger, t): [] for t in defaults}
    for s in spans:
        if isinstance(s, Span):
            start, end, typ, score = s.start, s.end, s.type, s.score
        else:
            start, end, typ, score = s if len(s) == 4 else (*s, 1.0)
        if not typ:
            continue  # dolma skips empty type names
        out.setdefault(_key(experiment, tagger, typ), []).append(
            [int(start), int(end), round(float(score), 5)]
        )
    return out


def load_modules(modules: Iterable[str]) -> None:
    """Import user tagger modules (a ``.py`` path or a dotted module name); classes decorated
    with :func:`register`, or any class with a string ``name`` and a ``predict`` method
    defined in the module, become available by name."""
    for spec in modules:
        if spec.endswith(".py") or "/" in spec:
            path = Path(spec).resolve()
            if not path.is_file():
                raise InvalidInputError(f"tagger module {spec}: no such file")
            modname = f"lmdata_user_taggers_{xxhash.xxh3_64_hexdigest(str(path).encode())}"
            mod = sys.modules.get(modname)
            if mod is None:
                s = importlib.util.spec_from_file_location(modname, path)
                if s is None or s.loader is None:
                    raise InvalidInputError(f"tagger module {spec}: cannot be imported")
                mod = importlib.util.module_from_spec(s)
                sys.modules[modname] = mod
                s.loader.exec_module(mod)
        else:
            try:
                mod = importlib.import_module(spec)
            except ImportError as e:
                raise InvalidInputError(f"tagger module {spec!r} cannot be imported: {e}") from None
        for obj in vars(mod).values():
            if (
                inspect.isclass(obj)
                and obj.__module__ == mod.__name__
                and isinstance(getattr(obj, "name", None), str)
                and obj.name
                and callable(getattr(obj, "predict", None))
                and obj.name not in REGISTRY
            ):
                register(obj)


def make_tagger(name: str, **options: Any) -> Any:
    """An instance of tagger ``name``; options the constructor accepts (e.g. ``seed``)."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise InvalidInputError(
            f"unknown tagger {name!r}; built in: {', '.join(sorted(REGISTRY))} (add your own "
            "with --tagger-modules)"
        )
    params = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in options.items() if k in params})


# --------------------------------------------------------------------------------------------
# built-in taggers

_PARAGRAPH = re.compile(r"[^\n]*\n|[^\n]+$")


def paragraphs(text: str) -> list[tuple[int, int]]:
    """dolma's paragraphs: each line *with* its newline; whitespace-only ones dropped."""
    return [m.span() for m in _PARAGRAPH.finditer(text) if m.group().strip()]


def _whole(text: str, typ: str, score: float) -> list[Span]:
    return [Span(0, len(text), typ, float(score))]


@register
class CharLengthV1(Tagger):
    name = "char_length_v1"

    def predict(self, doc: dict[str, Any]) -> list[Span]:
        return _whole(doc["text"], "length", len(doc["text"]))


@register
class CharLengthWithParagraphsV1(Tagger):
    name = "char_length_with_paragraphs_v1"

    def predict(self, doc: dict[str, Any]) -> list[Span]:
        text = doc["text"]
        spans = [Span(s, e, "paragraph", float(e - s)) for s, e in paragraphs(text)]
        spans.append(Span(0, len(text), "document", float(len(text))))
        return spans


@register
class BytesLengthV1(Tagger):
    name = "bytes_length_v1"

    def predict(self, doc: dict[str, Any]) -> list[Span]:
        return _whole(doc["text"], "length", len(doc["text"].encode("utf-8", "surrogatepass")))


@functools.cache
def _ws_tokens() -> Any:
    """dolma's pattern under the `regex` module, whose \\w also covers marks and joiners
    (loaded on the first text that is not ASCII)."""
    import regex

    return regex.compile(r"\w+|[^\w\s]+")


# Each ASCII character's class under that pattern's \w and \s: "w" word, " " space, "p" other
# (\x1c-\x1f are not \s to the regex module, unlike str.isspace)
_ASCII_CLASS = bytes(
    ord("w") if chr(i).isalnum() or i == 95 else 32 if chr(i) in " \t\n\v\f\r" else ord("p")
    for i in range(128)
).ljust(256, b"p")


def whitespace_count(text: str) -> int:
    """dolma's "whitespace tokenizer" length: pieces between word and symbol runs, plus one.

    The pieces are one more than the runs of word or of symbol characters. ASCII text (the
    common case) counts the runs from a class per byte, without the regex: every run starts
    the text, follows a space, or switches class (``wp``/``pw``)."""
    if not text.isascii():
        return len(_ws_tokens().split(text))
    c = text.encode("ascii").translate(_ASCII_CLASS)
    runs = c.count(b" w") + c.count(b" p") + c.count(b"wp") + c.count(b"pw")
    return runs + (c[:1] not in (b"", b" ")) + 1


@register
class WhitespaceTokenizerV1(Tagger):
    name = "whitespace_tokenizer_v1"

    def predict(self, doc: dict[str, Any]) -> list[Span]:
        return _whole(doc["text"], "length", whitespace_count(doc["text"]))


@register
class WhitespaceTokenizerWithParagraphsV1(Tagger):
    name = "whitespace_tokenizer_with_paragraphs_v1"

    def predict(self, doc: dict[str, Any]) -> list[Span]:
        text = doc["text"]
        spans = [
            Span(s, e, "paragraph", float(whitespace_count(text[s:e]))) for s, e in paragraphs(text)
        ]
        spans.append(Span(0, len(text), "document", float(sum(s.score for s in spans))))
        return spans


@register
class RandomNumberV1(Tagger):
    """A number in [0, 1) per document for sampling (filter on ``...__random[0][2] < p``).

    dolma seeds with the worker's pid, so its numbers change from run to run; here the number
    is a hash of (seed, source, id), the same whatever the order or number of processes.
    """

    name = "random_number_v1"

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF

    def predict(self, doc: dict[str, Any]) -> list[Span]:
        key = f"{doc.get('source', '')}\0{doc.get('id', '')}".encode("utf-8", "surrogatepass")
        return _whole(doc["text"], "random", xxhash.xxh3_64_intdigest(key, self.seed) / 2.0**64)


# PII. The patterns and the clean-up rules reproduce what dolma's pii_regex_v1/v2 flag (the
# fixture's pii-regex attributes are matched exactly): a match's span includes the separators
# the pattern consumes around it (e.g. the space before an e-mail address).
_EMAIL = re.compile(r"[.\s@,?!;:)(]*([^\s@]+@[^\s@,?!;:)(]+?)[.\s@,?!;:)(]?\s")
_PHONE = re.compile(r"\s+\(?(\d{3})\)?[-. ]*(\d{3})[-. ]?(\d{4})")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"
_IP = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")
_REAL_EMAIL = re.compile(r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+")
_URL = re.compile(r"(?i)(?:https?://|www\d{0,3}\.|[a-z0-9.\-]+\.[a-z]{2,4}/)")
PII_WINDOW = 100


class _PiiRegex(Tagger):
    def _keep(self, text: str, typ: str, start: int, end: int) -> bool:
        mention = text[start:end]
        if typ == "EMAIL_ADDRESS":
            return _REAL_EMAIL.search(mention) is not None
        context = text[max(0, start - PII_WINDOW) : end + PII_WINDOW]
        if "isbn" in context or "doi" in context or "#" in context:
            return False  # numbers next to these are identifiers, not PII
        return typ == "IP_ADDRESS" or _URL.search(mention) is None

    def predict(self, doc: dict[str, Any]) -> list[Span]:
        text = doc["text"]
        spans = []
        for typ, rx in (("EMAIL_ADDRESS", _EMAIL), ("PHONE_NUMBER", _PHONE), ("IP_ADDRESS", _IP)):
            for m in rx.finditer(text):
                if self._keep(text, typ, m.start(), m.end()):
                    spans.append(Span(m.start(), m.end(), typ, 1.0))
        words = len(text.split())
        score = len(spans) / words if words else -1.0
        spans.append(Span(0, len(text), "doc", score))
        return spans


@register
class PiiRegexV1(_PiiRegex):
    name = "pii_regex_v1"


@register
class PiiRegexV2(_PiiRegex):
    name = "pii_regex_v2"


BUILTIN: tuple[str, ...] = tuple(REGISTRY)


def tag_document(
    doc: dict[str, Any], taggers: list[tuple[str, str, Any]]
) -> dict[str, list[list[Any]]]:
    """All taggers' grouped outputs for one document: ``taggers`` is (experiment, name, obj)."""
    out: dict[str, list[list[Any]]] = {}
    for exp, name, obj in taggers:
        out.update(group_output(obj.predict(doc), exp, name, getattr(obj, "defaults", ())))
    return out


Predictor = Callable[[dict[str, Any]], Iterable[Span]]
