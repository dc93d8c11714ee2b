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
    default=100,
    show_default=True,
    help="Batches to read back from each token dataset.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="Worker processes (default: all cores).",
)
def command(out: str, limit: int | None, steps: int, workers: int | None) -> None:
    """The main job end to end on the Python standard library's sources: a Dolma tree,
    tokenized into every token format, converted across formats, validated, and read back as
    shuffled packed batches."""
    from lmdata.demo import run

    run(Path(out), limit=limit, steps=steps, workers=workers, log=click.echo)
