"""``lmdata convert SRC DST --to FORMAT``: between any two formats."""

from __future__ import annotations

from typing import Any

import click

from lmdata.cli._common import (
    DatasetPath,
    FormatName,
    engine_options,
    say_resume,
    split_option,
    storage_option,
    unsafe_pickle_option,
)
from lmdata.convert import convert


@click.command("convert")
@click.argument("src", type=DatasetPath())
@click.argument("dst")
@click.option(
    "--to",
    "to",
    required=True,
    type=FormatName(),
    help="Output format.",
)
@click.option(
    "--format",
    "-f",
    "source_format",
    type=FormatName(),
    default=None,
    help="SRC's format (detected).",
)
@split_option
@click.option(
    "--token-column",
    default=None,
    metavar="NAME",
    help="Read SRC (a records dataset such as MDS or Atlas) as token sequences from this "
    "column, e.g. to convert `tokenize --to mds` output into a token format.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="Processes reading SRC in parallel (default: all cores).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted convert: the source blocks already done are not read again "
    "(their staged copies are replayed); the output is the same. A source whose size or version "
    "(mtime, ETag) changed, or other options, is refused. A job run in this process (--workers 0 "
    "or 1, or one block) stages its blocks only with --resume: pass it from the first run to "
    "make such a job resumable.",
)
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@storage_option
@unsafe_pickle_option
@click.option("--quiet", "-q", is_flag=True, help="No progress (bar or log lines).")
@engine_options
def command(
    src: str,
    dst: str,
    to: str,
    source_format: str | None,
    split: str | None,
    token_column: str | None,
    workers: int | None,
    resume: bool,
    overwrite: bool,
    storage_options: dict[str, Any] | None,
    reader_options: dict[str, Any],
    quiet: bool,
    engine: str,
    address: str | None,
) -> None:
    """Convert SRC into format --to at DST: records to records, token sequences to token
    sequences, losslessly, or an error naming the field the target cannot hold.

    A format's fixed splits (flat-tokens: train and validation) are kept when the target has
    them too; otherwise --split picks one. The output is written atomically: Ctrl-C or a kill
    leaves none, and --resume continues from the blocks done.
    """
    from lmdata.cli._progress import shown
    from lmdata.convert import work_area
    from lmdata.storage import options_scope

    ropts = dict(reader_options)
    if token_column is not None:
        ropts["token_column"] = token_column
    try:
        with shown(quiet) as progress:
            summary = convert(
                src,
                dst,
                format=to,
                source_format=source_format,
                split=split,
                workers=workers,
                engine=engine,
                address=address,
                overwrite=overwrite,
                reader_options=ropts,
                progress=progress,
                storage_options=storage_options,
                resume=resume,
            )
    except (KeyboardInterrupt, Exception) as e:
        with options_scope(storage_options):
            say_resume(e, lambda: work_area(dst))
        raise
    click.echo(summary.line())
