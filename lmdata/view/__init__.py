"""``lmdata view``: a small read-only web page over any dataset, served on 127.0.0.1."""

from __future__ import annotations

import os
from typing import Any

from lmdata.view.data import ViewData
from lmdata.view.server import ViewServer

__all__ = ["ViewData", "ViewServer", "make_server"]


def make_server(
    path: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    **options: Any,
) -> ViewServer:
    """A server for the dataset at ``path`` (not yet serving: call ``serve_forever`` or
    ``start_background``). ``options`` go to :class:`ViewData` (format, split, tokenizer,
    text_key, reader_options). ``port=0`` picks a free port; see ``server.url``."""
    return ViewServer(ViewData(path, **options), host=host, port=port)
