"""``lmdata convert SRC DST --to FORMAT``: between any two formats."""

from __future__ import annotations

import click

from lmdata.cli._common import split_option, unsafe_pickle_option
from lmdata.convert import RECORD_TARGETS, TOKEN_TARGETS, convert


@click.command("convert")
@click.argument("src", type=click.Path(exists=True))
@click.argument("dst", type=click.Path())
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Choice(TOKEN_TARGETS + RECORD_TARGETS),
    help="Output format.",
)
@click.option("--format", "-f", "source_format", default=None, help="SRC's format (detected).")
@split_option
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="Processes reading SRC in parallel (default: all cores).",
)
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@unsafe_pickle_option
@click.option("--quiet", "-q", is_flag=True, help="No progress (bar or log lines).")
def command(
    src: str,
    dst: str,
    to: str,
    source_format: str | None,
    split: str | None,
    workers: int | None,
    overwrite: bool,
    allow_unsafe_pickle: bool,
    quiet: bool,
) -> None:
    """Convert SRC into format --to at DST: records to records, token sequences to token
    sequences, losslessly, or an error naming the field the target cannot hold.

    flat-tokens to flat-tokens keeps both splits; otherwise --split picks one.
    """
    from lmdata.cli._progress import bar as progress_bar

    bar = progress_bar(unit="rec", quiet=quiet, desc="convert")
    ropts = {"allow_unsafe_pickle": True} if allow_unsafe_pickle else {}
    summary = convert(
        src,
        dst,
        to,
        source_format=source_format,
        split=split,
        workers=workers,
        overwrite=overwrite,
        reader_options=ropts,
        progress=lambda n: bar.update(n - bar.n),
    )
    bar.close()
    click.echo(summary.line())
