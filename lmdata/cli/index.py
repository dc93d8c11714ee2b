"""``lmdata index FILE.jsonl``: the raw index modalities reads (``FILE.idx``)."""

from __future__ import annotations

from typing import Any

import click

from lmdata._progress import bar as progress_bar
from lmdata.cli._common import DatasetPath, storage_option
from lmdata.formats.modalities_jsonl import build_index
from lmdata.storage import resolve

_PROGRESS_FROM = 64 << 20  # show a progress bar for files from 64 MiB


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
    store, key = resolve(path, storage_options)
    size = store.size(key) if store.exists(key) and not store.is_dir(key) else 0
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
            path,
            index_path,
            skip_invalid=skip_invalid,
            overwrite=overwrite,
            progress=progress,
            storage_options=storage_options,
        )
        bar.update(size - bar.n)
    click.echo(f"indexed {result.documents:,} documents -> {result.index_path}")
    if result.skipped:
        click.echo(f"skipped {len(result.skipped):,} invalid lines:", err=True)
        for s in result.skipped[:10]:
            click.echo(f"  line {s.line} (byte {s.offset}): {s.reason}", err=True)
        if len(result.skipped) > 10:
            click.echo(f"  ... and {len(result.skipped) - 10:,} more", err=True)
