"""``lmdata index FILE.jsonl``: the raw index modalities reads (``FILE.idx``)."""

from __future__ import annotations

import os

import click

from lmdata._progress import bar as progress_bar
from lmdata.formats.modalities_jsonl import build_index

_PROGRESS_FROM = 64 << 20  # show a progress bar for files from 64 MiB


@click.command("index")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--index-path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write the index (default: FILE's stem + .idx beside it).",
)
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Leave lines that are not JSON out of the index (counted) instead of failing.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing index.")
@click.option("--quiet", "-q", is_flag=True, help="No progress (bar or log lines).")
def command(
    path: str, index_path: str | None, skip_invalid: bool, overwrite: bool, quiet: bool
) -> None:
    """Index the lines of a JSONL file for O(1) random access.

    Writes the pickled list of (byte offset, byte length) that modalities' create_raw_index
    writes, byte for byte. Lines end at newline bytes only. A line that is not JSON stops the
    run with its line number and byte offset, and no index is written, unless --skip-invalid.
    """
    size = os.path.getsize(path)
    with progress_bar(
        total=size,
        unit="B",
        unit_scale=True,
        quiet=quiet,
        disable=size < _PROGRESS_FROM,
        desc="indexing",
    ) as bar:

        def progress(done: int) -> None:
            bar.update(done - bar.n)

        result = build_index(
            path, index_path, skip_invalid=skip_invalid, overwrite=overwrite, progress=progress
        )
        bar.update(size - bar.n)
    click.echo(f"indexed {result.documents:,} documents -> {result.index_path}")
    if result.skipped:
        click.echo(f"skipped {len(result.skipped):,} invalid lines:", err=True)
        for s in result.skipped[:10]:
            click.echo(f"  line {s.line} (byte {s.offset}): {s.reason}", err=True)
        if len(result.skipped) > 10:
            click.echo(f"  ... and {len(result.skipped) - 10:,} more", err=True)
