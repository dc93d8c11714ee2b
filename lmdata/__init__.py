"""lmdata: read, write, validate and convert language-model training data formats.

The public surface is small:

- :func:`open` — detect the format at a path and return a reader;
- :func:`writer` — a format's writer (a context manager with ``write``);
- :func:`validate` and :func:`info`;
- :class:`Loader` — packed or unpacked, shuffled, resumable training batches;
- :func:`tokenize` — documents (files or Python objects) to a token dataset;
- :func:`decode` — token ids (a sequence or a batch) back to text;
- :mod:`lmdata.errors` — every exception lmdata raises, rooted at ``LmdataError``.

The names are loaded on first use, so ``import lmdata`` (and ``lmdata --help``) stay fast:
numpy and the format packages are imported when a function first needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lmdata import errors
from lmdata._version import __version__
from lmdata.errors import LmdataError

if TYPE_CHECKING:
    from lmdata._api import detect, info, open, validate, writer
    from lmdata.inspect.decode import decode
    from lmdata.loader import Loader
    from lmdata.tokenize.api import tokenize

# public name -> module that defines it
_LAZY = {
    "detect": "lmdata._api",
    "info": "lmdata._api",
    "open": "lmdata._api",
    "validate": "lmdata._api",
    "writer": "lmdata._api",
    "decode": "lmdata.inspect.decode",
    "Loader": "lmdata.loader",
    "tokenize": "lmdata.tokenize.api",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lmdata' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# ``lmdata.tokenize`` is both a function (the public one) and the internal package of the
# same name. Importing the package binds the attribute to the module, once: do that now (the
# package is light), then drop the binding so the name resolves to the function on first use.
import lmdata.tokenize  # noqa: E402, F401

del globals()["tokenize"]

__all__ = [
    "LmdataError",
    "Loader",
    "__version__",
    "decode",
    "detect",
    "errors",
    "info",
    "open",
    "tokenize",
    "validate",
    "writer",
]
