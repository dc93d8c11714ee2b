"""``lmdata merge``: join datasets of one format into one (each format says how)."""

from __future__ import annotations

import click

from lmdata._api import merge
from lmdata.cli._common import FormatName


@click.command("merge")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("-o", "--output", required=True, type=click.Path(), help="Where to write the result.")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=FormatName(),
    default=None,
    help="Format of the inputs (detected).",
)
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
def command(inputs: tuple[str, ...], output: str, fmt: str | None, overwrite: bool) -> None:
    """Merge INPUTS into OUTPUT.

    modalities: concatenate .pbin files with a correct index. mds: join the index.json of
    partition folders. atlas: link the shards of several datasets into one.
    """
    result = merge(list(inputs), output, format=fmt, overwrite=overwrite)
    click.echo(result if isinstance(result, str) else f"merged {len(inputs)} inputs -> {output}")
