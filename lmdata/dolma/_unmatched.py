"""Rules of a mix stream that could not have done anything: a filter or span rule reading an
attribute no document of the job has (a misspelt name, a missing attribute set), or include
filters that matched no document. dolma writes the same output without a word; lmdata says so
in one line per rule, with the names that do exist (``--strict``: an error).

The units gather what this needs while they mix (:class:`lmdata.dolma.mixing.ShardStats`:
the documents no include matched, the attribute names seen), so it costs no second pass.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from lmdata.dolma.config import StreamConfig
from lmdata.dolma.jsonpath import attribute_names

if TYPE_CHECKING:
    from lmdata.dolma.mixing import ShardStats

MAX_NAMES = 1000  # attribute names a unit gathers at most (for the did-you-mean)
SHOWN = 8  # attribute names a warning lists at most


def _rules(stream: StreamConfig) -> list[tuple[str, str, tuple[str, ...]]]:
    """(kind, expression, attribute names it reads) of every rule of ``stream``."""
    out = [("include", e, attribute_names(e, stream.syntax)) for e in stream.include]
    out += [("exclude", e, attribute_names(e, stream.syntax)) for e in stream.exclude]
    out += [
        ("span_replacement", r.span, attribute_names(r.span, r.syntax))
        for r in stream.span_replacement
    ]
    return out


def rule_attributes(stream: StreamConfig) -> frozenset[str]:
    """Every attribute name the rules of ``stream`` read."""
    return frozenset(n for _, _, names in _rules(stream) for n in names)


_EFFECT = {
    "include": "this include matches no document",
    "exclude": "this exclude removes no document",
    "span_replacement": "this rule replaces no span",
}


def _present(name: str, seen: tuple[str, ...]) -> str:
    """The did-you-mean and the names that exist, for a warning."""
    if not seen:
        return "no document read has any attribute: check the stream's attribute sets"
    close = difflib.get_close_matches(name, seen, n=1, cutoff=0.6)
    # the closest names first, then the others in order
    ranked = difflib.get_close_matches(name, seen, n=SHOWN, cutoff=0.0)
    shown = ranked + [n for n in seen if n not in ranked][: SHOWN - len(ranked)]
    more = f", and {len(seen) - len(shown):,} more" if len(seen) > len(shown) else ""
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}attributes present: {', '.join(shown)}{more}"


def unmatched(stream: StreamConfig, total: ShardStats) -> list[str]:
    """One line per rule of ``stream`` that could not have done anything, judged by the
    ``total`` of the units that mixed it in this run (nothing when none read a document)."""
    if total.read == 0:
        return []
    out = []
    named_include = False
    for kind, expr, names in _rules(stream):
        for name in names:
            if name in total.attributes:
                continue
            named_include |= kind == "include"
            out.append(
                f"stream {stream.name!r}: {kind} {expr!r} reads attribute {name!r}, which none "
                f"of the {total.read:,} documents read has ({_present(name, total.attributes)}), "
                f"so {_EFFECT[kind]}"
            )
    if stream.include and total.not_included == total.read and not named_include:
        out.append(
            f"stream {stream.name!r}: the include filters matched none of the {total.read:,} "
            "documents read, so none was written"
        )
    return out
