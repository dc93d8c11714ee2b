"""``lmdata index FILE.jsonl``: the raw index modalities reads (``FILE.idx``)."""

from __future__ import annotations

from typing import Any

import click

from lmdata.cli._common import DatasetPath, storage_option
from lmdata.cli._progress import shown
from lmdata.formats.modalities_jsonl import build_index


@click.command("index")
@click.argument("path", type=DatasetPath())
@click.option(
    "--index-path",
    default=None,
    help="Where to write the index, a path or URL (default: FILE's stem + .idx beside it).",
)
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Leave lines that are not JSON out of the index (counted) instead of failing.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing index.")
@click.option("--quiet", "-q", is_flag=True, help="No progress (bar or log lines).")
@storage_option
def command(
    path: str,
    index_path: str | None,
    skip_invalid: bool,
    overwrite: bool,
    quiet: bool,
    storage_options: dict[str, Any] | None,
) -> None:
    """Index the lines of a JSONL file for O(1) random access.

    Writes the pickled list of (byte offset, byte length) that modalities' create_raw_index
    writes, byte for byte. Lines end at newline bytes only. A line that is not JSON stops the
    run with its line number and byte offset, and no index is written, unless --skip-invalid.
    """
    # a small file's index is done before a bar (or a log line) would show
    with shown(quiet, leave=False, delay=0.5) as progress:
        result = build_index(
            path,
            index_path,
            skip_invalid=skip_invalid,
            overwrite=overwrite,
            progress=progress,
            storage_options=storage_options,
        )
    click.echo(f"indexed {result.documents:,} documents -> {result.index_path}")
    if result.skipped:
        click.echo(f"skipped {len(result.skipped):,} invalid lines:", err=True)
        for s in result.skipped[:10]:
            click.echo(f"  line {s.line} (byte {s.offset}): {s.reason}", err=True)
        if len(result.skipped) > 10:
            click.echo(f"  ... and {len(result.skipped) - 10:,} more", err=True)
