"""``lmdata merge``: join datasets of one format into one (each format says how)."""

from __future__ import annotations

from typing import Any

import click

from lmdata._api import merge
from lmdata.cli._common import DatasetPath, FormatName, storage_option
from lmdata.cli._progress import shown


@click.command("merge")
@click.argument("inputs", nargs=-1, required=True, type=DatasetPath())
@click.option("-o", "--output", required=True, help="Where to write the result (a path or URL).")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=FormatName(),
    default=None,
    help="Format of the inputs (detected).",
)
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@storage_option
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="No progress on stderr (it counts the bytes of the inputs' data joined).",
)
def command(
    inputs: tuple[str, ...],
    output: str,
    fmt: str | None,
    overwrite: bool,
    storage_options: dict[str, Any] | None,
    quiet: bool,
) -> None:
    """Merge INPUTS into OUTPUT.

    modalities: concatenate .pbin files with a correct index (paths or URLs). mds: join the
    index.json of partition folders (local or on one object store). atlas: link the shards of
    several datasets into one.
    """
    with shown(quiet, leave=False, delay=0.5) as progress:
        result = merge(
            list(inputs),
            output,
            format=fmt,
            overwrite=overwrite,
            storage_options=storage_options,
            progress=progress,
        )
    click.echo(result.line())
