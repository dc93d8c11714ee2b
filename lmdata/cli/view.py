"""``lmdata view PATH``: browse a dataset in a local web page."""

from __future__ import annotations

from typing import Any

import click

from lmdata.cli._common import (
    DatasetPath,
    format_option,
    split_option,
    storage_option,
    text_key_option,
    tokenizer_option,
    unsafe_pickle_option,
)
from lmdata.errors import InvalidInputError


@click.command("view")
@click.argument("path", type=DatasetPath())
@format_option
@storage_option
@split_option
@tokenizer_option(
    "Show token ids as text with their boundaries: 'bytes' or a tokenizer file; default: "
    "the one that made the dataset, when it records one and the file is found."
)
@text_key_option
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to serve on (0 picks a free one).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. Anything but loopback shows the dataset to your network (to whoever "
    "has the URL printed, with its token). 0.0.0.0 answers to this machine's own names and "
    "addresses; add others with --allow-host.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this host name or address (how other machines reach this "
    "one: a DNS alias, an address behind NAT), repeatable. Requests naming any other host "
    "are refused (no DNS rebinding).",
)
@click.option("--verbose", "-v", is_flag=True, help="Log every request.")
@unsafe_pickle_option
def command(
    path: str,
    fmt: str | None,
    storage_options: dict[str, Any] | None,
    split: str | None,
    tokenizer: str | None,
    text_key: str,
    port: int,
    host: str,
    allow_hosts: tuple[str, ...],
    verbose: bool,
    reader_options: dict[str, Any],
) -> None:
    """Serve a read-only page over the dataset at PATH on http://127.0.0.1:PORT/: page
    through records (documents as text; token sequences decoded with --tokenizer, token
    boundaries on hover), jump to an index or id, see the dataset's info and length
    histogram. Open the URL it prints: it holds a token made for this run, which every
    request needs. Ctrl-C stops it."""
    from lmdata._redact import redact
    from lmdata.view import ViewData, ViewServer
    from lmdata.view.access import LOOPBACK, WILDCARDS

    if host not in LOOPBACK:
        click.echo(
            f"warning: serving on {host}: anyone who can reach it and has the URL below can "
            "read the data",
            err=True,
        )
    click.echo(f"opening {redact(path)} ...", err=True)
    data = ViewData(  # dataset errors are reported as such, before the port is tried
        path,
        format=fmt,
        split=split,
        tokenizer=tokenizer,
        text_key=text_key,
        storage_options=storage_options,
        reader_options=reader_options,
    )
    try:
        server = ViewServer(data, host=host, port=port, allow_hosts=allow_hosts)
    except OSError as e:
        raise InvalidInputError(
            f"cannot listen on {host}:{port} ({e.strerror}); choose another with --port "
            "(0 picks a free one)"
        ) from None
    server.verbose = verbose
    click.echo(f"lmdata view: {server.url}  (Ctrl-C stops)")
    if host in WILDCARDS or allow_hosts:
        others = sorted(server.access.hosts - set(LOOPBACK))
        for name in others:
            click.echo(f"  also: {server.url_for(name)}")
        click.echo(
            "  (a client reaching this machine by another name is refused: add --allow-host NAME)"
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
