"""The registry of formats: a table of format packages, each exporting one typed ``SPEC``.

A spec (:class:`lmdata.formats._spec.FormatSpec`) carries a format's names, kind (records or
token sequences), splits, verbs (``detect``, ``open``, ``writer``, ``validate``, ``info``,
``merge``) and how ``tokenize`` and ``convert`` write tokens into it. Nothing outside
``lmdata/formats/`` names a format: it asks the spec. Adding a format is one package and one
line below.

Packages are imported only when used, so a missing optional dependency of one format never
breaks another; a package imports its reader, writer and validator only when a verb runs
(:func:`lmdata.formats._spec.lazy`), so detecting a format costs its detector's imports alone.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from lmdata import _deps
from lmdata.errors import FormatError, LmdataError, StorageError
from lmdata.formats._spec import (
    FormatSpec,
    Kind,
    MergeSummary,
    TokenSink,
    TokenTarget,
    check_writer_options,
)

__all__ = [
    "FormatSpec",
    "Kind",
    "MergeSummary",
    "TokenSink",
    "TokenTarget",
    "canonical",
    "check_writer_options",
    "detect",
    "names",
    "spec",
    "specs",
    "suggest",
    "token_targets",
]

# name -> module exporting SPEC (or SPECS, for a module that serves several names).
# Order matters for detection: the first detector that says yes wins, so the more specific
# layouts come first.
FORMATS: dict[str, str] = {
    "flat-tokens": "lmdata.formats.flat_tokens",
    "atlas": "lmdata.formats.atlas",
    "modalities": "lmdata.formats.modalities",
    "modalities-jsonl": "lmdata.formats.modalities_jsonl",
    "mds": "lmdata.formats.mds",
    "mds-csv": "lmdata.formats.mds",
    "mds-tsv": "lmdata.formats.mds",
    "mds-jsonl": "lmdata.formats.mds",
    "dolma": "lmdata.formats.dolma",
    "jsonl": "lmdata.formats.jsonl",  # last: any *.jsonl without an index
}

_SPECS: dict[str, FormatSpec] = {}


def names() -> list[str]:
    """Every format name, in detection order."""
    return list(FORMATS)


def _load(name: str) -> FormatSpec:
    got = _SPECS.get(name)
    if got is not None:
        return got
    modname = FORMATS[name]
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name == modname:
            raise FormatError(f"format {name!r} is not implemented in this version") from None
        raise _deps.missing(e.name or modname, f"format {name!r}") from None
    found = getattr(mod, "SPECS", None) or (mod.SPEC,)
    for s in found:
        _SPECS[s.name] = s
    if name not in _SPECS:
        raise FormatError(f"{modname} exports no spec named {name!r} (a bug in lmdata)")
    return _SPECS[name]


def specs() -> list[FormatSpec]:
    """Every format's spec, in detection order."""
    return [_load(n) for n in FORMATS]


def suggest(name: str) -> str:
    """``"; did you mean 'x'?"`` for a misspelt format name, else an empty string."""
    import difflib

    candidates = list(FORMATS) + [a for s in specs() for a in s.aliases]
    close = difflib.get_close_matches(name.lower().replace("_", "-"), candidates, n=1, cutoff=0.5)
    if not close:
        return ""
    target = canonical(close[0])
    return f"; did you mean {target!r}?"


def canonical(name: str) -> str:
    """The format name for ``name`` or one of its aliases, or a FormatError with a suggestion."""
    if name in FORMATS:
        return name
    for s in specs():
        if name in s.aliases:
            return s.name
    raise FormatError(
        f"unknown format {name!r}{suggest(name)} (known formats: {', '.join(FORMATS)})"
    )


def spec(name: str) -> FormatSpec:
    """The spec of format ``name`` (an alias is accepted)."""
    return _load(canonical(name))


def token_targets() -> list[str]:
    """Formats that ``tokenize`` can write."""
    return [s.name for s in specs() if s.tokens is not None]


def detect(path: str | os.PathLike[str]) -> str:
    """The name of the format at ``path``, or FormatError listing what was tried."""
    p = path if isinstance(path, str) else Path(path)  # a URL stays a URL
    asked: set[int] = set()
    for name in FORMATS:  # spec by spec: a format found early imports no later package
        s = _load(name)
        if id(s.detect) in asked:
            continue  # one detector serves a whole family (the MDS names)
        asked.add(id(s.detect))
        try:
            found = s.detect(p)
        except StorageError:  # the store failed: say so, not "not this format"
            raise
        except (LmdataError, OSError, RecursionError, ValueError):
            continue  # a file this format cannot even look at is not of this format
        if found:
            return found
    raise FormatError(
        f"cannot tell the format; pass format= (--format) with one of: {', '.join(FORMATS)}",
        path=p,
    )
