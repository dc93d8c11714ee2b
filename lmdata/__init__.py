"""lmdata: read, write, validate and convert language-model training data formats.

The public surface is small:

- :func:`open` — detect the format at a path and return a reader;
- :func:`writer` — a format's writer (a context manager with ``write``);
- :func:`validate` and :func:`info`;
- :class:`Loader` — packed or unpacked, shuffled, resumable training batches;
- :func:`tokenize` — documents (files or Python objects) to a token dataset;
- :func:`decode` — token ids (a sequence or a batch) back to text;
- :mod:`lmdata.errors` — every exception lmdata raises, rooted at ``LmdataError``.
"""

from __future__ import annotations

from lmdata import errors
from lmdata._api import detect, info, open, validate, writer
from lmdata.errors import LmdataError
from lmdata.inspect.decode import decode
from lmdata.loader import Loader

# The function shadows the internal package of the same name as an attribute of ``lmdata``:
# importing it loads the package first (binding ``lmdata.tokenize`` to it), then rebinds the
# name; ``from lmdata.tokenize import ...`` and ``import lmdata.tokenize.x`` still work.
from lmdata.tokenize.api import tokenize

__all__ = [
    "LmdataError",
    "Loader",
    "decode",
    "detect",
    "errors",
    "info",
    "open",
    "tokenize",
    "validate",
    "writer",
]
__version__ = "0.1.0"
