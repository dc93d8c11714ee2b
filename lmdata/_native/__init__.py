"""lmdata's optional C extensions, built at install from the sources beside this file, and the
one way lmdata loads them: :func:`load` returns an extension, or None where lmdata runs its
pure-Python twin instead (same results, slower).

None when the extension was not built (no C compiler at install), when ``LMDATA_PURE_PYTHON``
is set (any value but ``0``: the tests run the native paths' files a second time so), or when
the build is stale: its sources are here (an editable install, a checkout) and are not the
ones it was built from (each build carries the digest of its sources, see ``_sources.py``).
A stale build is never used, since it may answer for older code; a warning says how to
rebuild (``make install`` rebuilds whenever a source changed). A wheel ships its builds
without their sources: nothing to compare, the build is used.
``python -m lmdata._native`` prints the state of each extension.
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from types import ModuleType

from lmdata._native import _sources

PURE_ENV = "LMDATA_PURE_PYTHON"
# one per NAME.c here (tests/test_native.py checks); the sources are absent from a wheel
EXTENSIONS = ("kernel", "mdsread", "memowalk", "minhash")
# what runs without each (the report of ``python -m lmdata._native``)
FALLBACKS = {
    "kernel": "the Loader lays rows out in numpy, flat-tokens windows are looked up in Python",
    "mdsread": "MDS samples are decoded by generated Python functions",
    "memowalk": "the safe unpickler's memo walk runs in Python",
    "minhash": "MinHash dedupe and decontaminate run in numpy",
}
BUILT, NOT_BUILT, STALE, BROKEN, OFF = "built", "not built", "stale", "does not load", "off"
_REBUILD = "rebuild it with `make install` (or `pip install -e .`) in the checkout"


def pure_python() -> bool:
    """Whether ``LMDATA_PURE_PYTHON`` asks for the pure-Python paths (any value but "" or "0")."""
    return os.environ.get(PURE_ENV, "").strip() not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The extension ``lmdata._native.<name>``, or None where the pure-Python path runs
    (not built, ``LMDATA_PURE_PYTHON`` set, or stale: then with a warning, once)."""
    if name not in EXTENSIONS:
        raise ValueError(f"no C extension {name!r} in lmdata._native (there are {EXTENSIONS})")
    if pure_python():
        return None
    state, module, why = _probe(name)
    if state in (STALE, BROKEN) and name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"lmdata's C extension lmdata._native.{name} {why}, so lmdata runs its pure-Python "
            f"path instead (same results, slower); {_REBUILD}",
            RuntimeWarning,
            stacklevel=2,
        )
    return module if state == BUILT else None


_warned: set[str] = set()


@functools.cache
def _probe(name: str) -> tuple[str, ModuleType | None, str]:
    """(state, the module if it is current, why) of one extension."""
    full = f"{__name__}.{name}"
    try:
        module = importlib.import_module(full)
    except ModuleNotFoundError as e:
        if e.name == full:
            return NOT_BUILT, None, "was not built (no C compiler at install)"
        return BROKEN, None, f"is there but does not load ({e})"
    except ImportError as e:
        return BROKEN, None, f"is there but does not load ({e})"
    root = _sources.HERE
    if not (root / f"{name}.c").is_file():
        return BUILT, module, "is built (installed without its sources)"
    files = _sources.sources(name, root)
    if getattr(module, "SOURCE_DIGEST", "") != _sources.digest(files):
        listed = ", ".join(p.name for p in files)
        return STALE, None, f"is stale: built from other sources than the {listed} beside it"
    return BUILT, module, "is built from the sources beside it"


def status() -> dict[str, tuple[str, str]]:
    """Per extension, (state, why): ``built``, ``not built``, ``stale``, ``does not load``,
    or ``off`` under ``LMDATA_PURE_PYTHON``."""
    if pure_python():  # nothing imported
        return dict.fromkeys(EXTENSIONS, (OFF, f"is not loaded: {PURE_ENV} is set"))
    return {name: (_probe(name)[0], _probe(name)[2]) for name in EXTENSIONS}


def report() -> str:
    """One line per extension: its state and, where it is not used, what runs instead."""
    lines = []
    for name, (state, why) in status().items():
        line = f"lmdata._native.{name} {why}"
        if state != BUILT:
            line += f"; without it {FALLBACKS[name]} (same results, slower)"
        if state in (STALE, BROKEN):
            line += f"; {_REBUILD}"
        lines.append(line)
    return "\n".join(lines)
