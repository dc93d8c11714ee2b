"""``lmdata manifest PATH``: write the integrity manifest of a dataset another tool wrote, or
check a dataset against its manifest (``--check``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from lmdata._api import check_manifest, write_manifest
from lmdata._units import human_bytes
from lmdata.cli._common import DatasetPath, format_option, storage_option, unsafe_pickle_option
from lmdata.cli._progress import shown


@click.command("manifest")
@click.argument("path", type=DatasetPath())
@click.option(
    "--check",
    is_flag=True,
    help="Verify the dataset against its manifest: every file's presence and size, then "
    "every block's hash (exit status 1 on a difference). Without it, write the manifest.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an existing manifest (the data is validated first, and its present bytes "
    "become what later checks compare with).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Threads hashing the files (default: one per CPU).",
)
@format_option
@storage_option
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but problems; no progress.")
@unsafe_pickle_option
def command(
    path: str,
    check: bool,
    overwrite: bool,
    workers: int | None,
    fmt: str | None,
    storage_options: dict[str, Any] | None,
    quiet: bool,
    reader_options: dict[str, Any],
) -> None:
    """Write PATH's manifest (every file's size, record count and xxh3-128 hashes, per 4 MiB
    block) after validating it, for a dataset another tool wrote; lmdata's writers leave one
    already. With --check, compare the dataset with its manifest instead.

    Progress goes to stderr, counting the bytes validated and hashed.
    """
    if check:
        with shown(quiet, leave=False, delay=0.5) as progress:
            made, problems = check_manifest(
                path, storage_options=storage_options, progress=progress, workers=workers
            )
        if problems:
            click.echo(
                f"{path}: {len(problems)} difference(s) from its manifest ({made['file']}):",
                err=True,
            )
            for p in problems:
                click.echo(f"  - {p}", err=True)
            sys.exit(1)
        if not quiet:
            click.echo(f"{path}: matches its manifest ({_what(made)})")
        return
    with shown(quiet, leave=False, delay=0.5) as progress:
        made = write_manifest(
            path,
            format=fmt,
            storage_options=storage_options,
            overwrite=overwrite,
            progress=progress,
            workers=workers,
            **reader_options,
        )
    if not quiet:
        click.echo(f"{path}: wrote {made['file']} ({_what(made)})")


def _what(made: dict[str, Any]) -> str:
    records = f", {made['records']:,} records" if made.get("records") is not None else ""
    return (
        f"{made['files']:,} files, {made['bytes']:,} bytes ({human_bytes(made['bytes'])})"
        f"{records}, made {made['made'] or 'at a time the store does not say'}"
    )
