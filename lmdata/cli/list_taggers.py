"""``lmdata list``: the taggers ``lmdata tag`` can run (dolma's ``list``)."""

from __future__ import annotations

import click

from lmdata.dolma.cli_support import DolmaCommand
from lmdata.dolma.taggers import REGISTRY, load_modules


@click.command("list", cls=DolmaCommand)
@click.option(
    "--tagger-modules",
    "--tagger_modules",
    "tagger_modules",
    multiple=True,
    help="A .py file or module defining your own taggers; repeatable or space-separated.",
)
def command(tagger_modules: tuple[str, ...]) -> None:
    """List the taggers `lmdata tag --taggers` accepts, one name a line, as `dolma list`."""
    load_modules(tagger_modules)
    for name in sorted(REGISTRY):
        click.echo(name)
