"""``lmdata merge``: join datasets of one format into one (each format says how)."""

from __future__ import annotations

import click

from lmdata import formats
from lmdata._api import detect


@click.command("merge")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("-o", "--output", required=True, type=click.Path(), help="Where to write the result.")
@click.option("--format", "-f", "fmt", default=None, help="Format of the inputs (detected).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
def command(inputs: tuple[str, ...], output: str, fmt: str | None, overwrite: bool) -> None:
    """Merge INPUTS into OUTPUT.

    modalities: concatenate .pbin files with a correct index. mds: join the index.json of
    partition folders. atlas: link the shards of several datasets into one.
    """
    name = formats.canonical(fmt) if fmt else detect(inputs[0])
    mod = formats.module(name)
    if not hasattr(mod, "merge"):
        raise click.UsageError(f"format {name} has no merge")
    result = mod.merge(list(inputs), output, overwrite=overwrite)
    click.echo(result if isinstance(result, str) else f"merged {len(inputs)} inputs -> {output}")
