"""``lmdata view``: a small read-only web page over any dataset, served on 127.0.0.1 to whoever
holds the URL it prints (a per-run token)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from lmdata.view.data import ViewData
from lmdata.view.server import ViewServer

__all__ = ["ViewData", "ViewServer", "make_server"]


def make_server(
    path: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    allow_hosts: Iterable[str] = (),
    token: str | None = None,
    **options: Any,
) -> ViewServer:
    """A server for the dataset at ``path`` (not yet serving: call ``serve_forever`` or
    ``start_background``). ``options`` go to ``ViewData`` (format, split, tokenizer,
    text_key, reader_options). ``port=0`` picks a free port; ``server.url`` is the address to
    open, with the access token (random unless ``token`` is given); ``allow_hosts`` are more
    names clients may reach it by (see ``ViewServer``)."""
    return ViewServer(
        ViewData(path, **options), host=host, port=port, allow_hosts=allow_hosts, token=token
    )
