"""``lmdata demo``: the main job end to end on the standard library's sources."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("demo")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="demo-output",
    show_default=True,
    help="Folder for the datasets the demo writes (replaced on each run).",
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Use only the first N source files."
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Batches to read back.",
)
def command(out: str, limit: int | None, steps: int) -> None:
    """Tokenize the Python standard library into a flat-tokens dataset, validate it, and
    read shuffled packed batches from it."""
    from lmdata.demo import run

    Path(out).mkdir(parents=True, exist_ok=True)
    run(Path(out), limit=limit, steps=steps, log=click.echo)
