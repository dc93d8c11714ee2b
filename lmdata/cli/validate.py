"""``lmdata validate PATH``: check every invariant of a dataset's format."""

from __future__ import annotations

import sys
from typing import Any

import click

from lmdata._api import detect, manifest_summary, validate
from lmdata.cli._common import DatasetPath, format_option, storage_option, unsafe_pickle_option
from lmdata.cli._progress import shown


@click.command("validate")
@click.argument("path", type=DatasetPath())
@format_option
@storage_option
@click.option(
    "--deep",
    is_flag=True,
    help="Also hash every file (in parallel) against the dataset's manifest and name the "
    "first block that differs from what its writer wrote (without it, the manifest's "
    "names and sizes are compared).",
)
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
    deep: bool,
    quiet: bool,
    reader_options: dict[str, Any],
) -> None:
    """Check a dataset against its format's rules and, where it has one (lmdata's writers
    leave one), its manifest: a file deleted, added, truncated or grown since it was
    written is named; --deep finds changed bytes too.

    Exit status 0 when valid, 1 when problems were found (each printed with its place),
    2 when the dataset cannot be opened at all. Progress goes to stderr (a bar on a
    terminal, a line every LMDATA_PROGRESS_INTERVAL seconds in a log), counting the bytes
    of the dataset's data checked.
    """
    name = fmt or detect(path, storage_options=storage_options)
    with shown(quiet, leave=False, delay=0.5) as progress:
        problems = validate(
            path,
            format=name,
            storage_options=storage_options,
            progress=progress,
            deep=deep,
            **reader_options,
        )
    if not problems:
        if not quiet:
            made = manifest_summary(path, storage_options=storage_options)
            if isinstance(made, dict):
                how = "every byte matches" if deep else "names and sizes match"
                click.echo(f"{path}: valid {name} dataset ({how} its manifest)")
            else:
                note = " (no manifest: `lmdata manifest PATH` writes one)" if deep else ""
                click.echo(f"{path}: valid {name} dataset{note}")
        return
    if not quiet:
        click.echo(f"{path}: {len(problems)} problem(s) in this {name} dataset:", err=True)
        for p in problems:
            click.echo(f"  - {p}", err=True)
    sys.exit(1)
