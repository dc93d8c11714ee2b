"""The per-document rules of a mix stream, as dolma applies them: filters (JSONPath or jq
selectors, compiled once), span replacement, and the trimmed-length test."""

from __future__ import annotations

import functools
from typing import Any

import orjson

from lmdata.dolma.config import SpanReplacement
from lmdata.dolma.jsonpath import JqExpr, JsonPath, compile_selector
from lmdata.errors import CorruptDataError, LmdataError

# Rust's str::trim removes Unicode White_Space, a slightly different set from str.strip()'s.
RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


@functools.lru_cache(maxsize=256)
def selector(expr: str, syntax: str) -> JsonPath | JqExpr:
    """The compiled selector of ``expr`` (cached: units compile each expression once)."""
    return compile_selector(expr, syntax)


def any_match(
    selectors: tuple[tuple[str, JsonPath | JqExpr], ...], doc: dict[str, Any], where: str, line: int
) -> bool:
    """True if any selector matches ``doc``; a jq runtime error fails the shard, as in dolma."""
    for expr, sel in selectors:
        try:
            if sel.matches(doc):
                return True
        except LmdataError:
            raise
        except Exception as e:
            raise CorruptDataError(
                f"filter {expr!r} failed on this document: {e}", path=where, position=f"line {line}"
            ) from None
    return False


def _render(template: str, original: str, doc: dict[str, Any]) -> str:
    if template.startswith("\\$"):
        template = template[1:]
    elif template.startswith("$"):  # a jq selector on the document (dolma PR #200)
        v = selector(template[1:] or ".", "jq").first(doc)
        return v if isinstance(v, str) else orjson.dumps(v).decode()
    return template.replace("{}", original)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def replace_spans(text: str, doc: dict[str, Any], rules: tuple[SpanReplacement, ...]) -> str:
    """Apply every rule's spans at once: sorted by start, a span starting inside an earlier
    replaced one is skipped; ``min_score <= score < max_score`` selects spans."""
    todo: list[tuple[int, int, SpanReplacement]] = []
    for rule in rules:
        spans = selector(rule.span, rule.syntax).first(doc)
        if not isinstance(spans, list):
            continue
        for sp in spans:
            if not (
                isinstance(sp, list)
                and len(sp) >= 3
                and _num(sp[2])
                and isinstance(sp[0], int)
                and isinstance(sp[1], int)
            ):
                continue
            score = float(sp[2])
            if rule.min_score is not None and score < rule.min_score:
                continue
            if rule.max_score is not None and score >= rule.max_score:
                continue
            todo.append((sp[0], sp[1], rule))
    if not todo:
        return text
    todo.sort(key=lambda t: t[0])
    out = []
    pos = 0
    for s, e, rule in todo:
        if s < pos or s > len(text):
            continue
        e = min(max(e, s), len(text))  # dolma's deduper can end a span one past the text
        out.append(text[pos:s])
        out.append(_render(rule.replacement, text[s:e], doc))
        pos = e
    out.append(text[pos:])
    return "".join(out)


def shorter_than(text: str, min_bytes: int) -> bool:
    """dolma's length test: the trimmed text has fewer than ``min_bytes`` UTF-8 bytes (a text of
    at least that many characters is long enough without encoding it)."""
    trimmed = text.strip(RUST_WHITESPACE)
    if len(trimmed) >= min_bytes:
        return False
    return len(trimmed.encode("utf-8", "surrogatepass")) < min_bytes
