"""``lmdata validate PATH``: check every invariant of a dataset's format."""

from __future__ import annotations

import sys
from typing import Any

import click

from lmdata._api import detect, validate
from lmdata._progress import reporting
from lmdata.cli._common import DatasetPath, format_option, storage_option, unsafe_pickle_option


@click.command("validate")
@click.argument("path", type=DatasetPath())
@format_option
@storage_option
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Print nothing, not even progress; only the exit status tells.",
)
@unsafe_pickle_option
def command(
    path: str,
    fmt: str | None,
    storage_options: dict[str, Any] | None,
    quiet: bool,
    reader_options: dict[str, Any],
) -> None:
    """Check a dataset against its format's rules.

    Exit status 0 when valid, 1 when problems were found (each printed with its place),
    2 when the dataset cannot be opened at all. Progress goes to stderr (a bar on a
    terminal, a line every LMDATA_PROGRESS_INTERVAL seconds in a log), counting the bytes
    of the dataset's data checked.
    """
    name = fmt or detect(path, storage_options)
    with reporting("validate", quiet) as progress:
        problems = validate(
            path,
            format=name,
            storage_options=storage_options,
            progress=progress,
            **reader_options,
        )
    if not problems:
        if not quiet:
            click.echo(f"{path}: valid {name} dataset")
        return
    if not quiet:
        click.echo(f"{path}: {len(problems)} problem(s) in this {name} dataset:", err=True)
        for p in problems:
            click.echo(f"  - {p}", err=True)
    sys.exit(1)
