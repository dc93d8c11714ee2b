"""lmdata: read, write, validate and convert language-model training data formats.

The public surface is small:

- :func:`open` — detect the format at a path and return a reader;
- :func:`writer` — a format's writer (a context manager with ``write``);
- :func:`validate` and :func:`info`;
- :func:`convert` — any dataset into another format; :func:`merge` — datasets of one format
  into one;
- :class:`Loader` — packed or unpacked, shuffled, resumable training batches;
- :func:`tokenize` — documents (files or Python objects) to a token dataset;
- :func:`decode` — token ids (a sequence or a batch) back to text;
- :class:`Progress` — the event every long verb's ``progress=`` callable receives;
- :mod:`lmdata.errors` — every exception lmdata raises, rooted at ``LmdataError``.

The names are loaded on first use, so ``import lmdata`` (and ``lmdata --help``) stay fast:
numpy and the format packages are imported when a function first needs them. Every verb
takes the path first and its options by keyword (``format=``, ``storage_options=``); an option
it does not take is an :class:`~lmdata.errors.InvalidInputError` naming the ones it does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmdata import _lazy, errors
from lmdata._version import __version__
from lmdata.errors import LmdataError

if TYPE_CHECKING:
    from lmdata._api import detect, info, merge, open, validate, writer
    from lmdata._progress import Progress
    from lmdata.convert import convert
    from lmdata.inspect.decode import decode
    from lmdata.loader import Loader
    from lmdata.tokenize.api import tokenize

# public name -> module that defines it, imported on first use; ``tokenize`` and ``convert``
# stay the functions when the modules of the same name (lmdata.tokenize, lmdata.convert) are
# imported
__getattr__ = _lazy.lazy_exports(
    __name__,
    {
        "convert": "lmdata.convert",
        "detect": "lmdata._api",
        "info": "lmdata._api",
        "merge": "lmdata._api",
        "open": "lmdata._api",
        "validate": "lmdata._api",
        "writer": "lmdata._api",
        "Progress": "lmdata._progress",
        "decode": "lmdata.inspect.decode",
        "Loader": "lmdata.loader",
        "tokenize": "lmdata.tokenize.api",
    },
)

__all__ = [
    "LmdataError",
    "Loader",
    "Progress",
    "__version__",
    "convert",
    "decode",
    "detect",
    "errors",
    "info",
    "merge",
    "open",
    "tokenize",
    "validate",
    "writer",
]


def __dir__() -> list[str]:
    """The public surface alone (no ``annotations``, ``TYPE_CHECKING`` or private modules)."""
    return sorted(__all__)
