"""The registry of formats: a plain table from format name to the module that implements it.

Every format module offers the same verbs:

- ``detect(path) -> bool``: does ``path`` look like this format (cheap: names and headers);
- ``open(path, **options)``: a reader (``Records`` or ``TokenSequences``);
- ``Writer(path, **options)``: a context manager with ``write(item)``;
- ``validate(path, **options) -> list[str]``: every problem found, empty when valid;
- ``info(path, **options) -> dict``: a summary for ``lmdata info``.

Modules are imported only when used, so a missing optional dependency of one format never
breaks another.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from lmdata.errors import FormatError, LmdataError, MissingDependencyError

# name -> module. Order matters for detection: the first module whose detect() says yes wins,
# so the more specific layouts come first.
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

ALIASES: dict[str, str] = {
    "flat_tokens": "flat-tokens",
    "zarr": "flat-tokens",
    "pbin": "modalities",
}


def canonical(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in FORMATS:
        raise FormatError(f"unknown format {name!r}; known formats: {', '.join(available())}")
    return name


def available() -> list[str]:
    """Format names whose module is present in this installation."""
    out = []
    for name, mod in FORMATS.items():
        if importlib.util.find_spec(mod) is not None:
            out.append(name)
    return out


def module(name: str) -> ModuleType:
    """The module implementing format ``name``."""
    name = canonical(name)
    modname = FORMATS[name]
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name == modname:
            raise FormatError(f"format {name!r} is not implemented in this version") from None
        raise MissingDependencyError(
            f"format {name!r} needs the package {e.name!r}: pip install 'lmdata[all]'"
        ) from None


def detect(path: str | os.PathLike[str]) -> str:
    """The name of the format at ``path``, or FormatError listing what was tried."""
    p = path if isinstance(path, str) else Path(path)  # a URL stays a URL
    seen: set[str] = set()
    for name in available():
        mod = module(name)
        if mod.__name__ in seen:
            continue
        seen.add(mod.__name__)
        # Modules that implement several names (mds) say which one they found.
        try:
            if hasattr(mod, "detect_format"):
                found = mod.detect_format(p)
                if found:
                    return found
            elif mod.detect(p):
                return name
        except (LmdataError, OSError):
            continue  # a file this format cannot even look at is not of this format
    raise FormatError(
        f"cannot tell the format; pass format= (--format) with one of: {', '.join(available())}",
        path=p,
    )
