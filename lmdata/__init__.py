"""lmdata: read, write, validate and convert language-model training data formats.

The public surface is small:

- :func:`open` — detect the format at a path and return a reader;
- :func:`writer` — a format's writer (a context manager with ``write``);
- :func:`validate` and :func:`info`;
- :class:`Loader` — packed or unpacked, shuffled, resumable training batches;
- :func:`tokenize` — documents (files or Python objects) to a token dataset;
- :func:`decode` — token ids (a sequence or a batch) back to text;
- :class:`Progress` — the event every long verb's ``progress=`` callable receives;
- :mod:`lmdata.errors` — every exception lmdata raises, rooted at ``LmdataError``.

The names are loaded on first use, so ``import lmdata`` (and ``lmdata --help``) stay fast:
numpy and the format packages are imported when a function first needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmdata import _lazy, errors
from lmdata._version import __version__
from lmdata.errors import LmdataError

if TYPE_CHECKING:
    from lmdata._api import detect, info, open, validate, writer
    from lmdata._progress import Progress
    from lmdata.inspect.decode import decode
    from lmdata.loader import Loader
    from lmdata.tokenize.api import tokenize

# public name -> module that defines it, imported on first use; ``tokenize`` stays the
# function when the package of the same name (lmdata.tokenize) is imported
__getattr__ = _lazy.lazy_exports(
    __name__,
    {
        "detect": "lmdata._api",
        "info": "lmdata._api",
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
    "decode",
    "detect",
    "errors",
    "info",
    "open",
    "tokenize",
    "validate",
    "writer",
]
