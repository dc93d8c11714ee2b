"""``lmdata clean URL``: remove what killed writers left (staged outputs, stale claims)."""

from __future__ import annotations

from typing import Any

import click

from lmdata._units import human_bytes
from lmdata.cli._common import DatasetPath, storage_option
from lmdata.storage import clean, parse_age


def _age(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f}{unit}"
    return f"{seconds:.0f}s"


@click.command("clean")
@click.argument("path", type=DatasetPath())
@click.option("--dry-run", "-n", is_flag=True, help="List what would be removed; remove nothing.")
@click.option(
    "--claims",
    is_flag=True,
    help="Also settle the .lmdata-writing claims of writers that are gone (object stores): a "
    "commit a kill cut short is finished from its staged copies, a write that never committed "
    "goes whole, a committed one loses only its claim. A writer of this machine that has ended "
    "counts whatever --older-than; one of another machine once older than it.",
)
@click.option(
    "--resumable",
    is_flag=True,
    help="Also remove the staging folders (.NAME.lmdata-work, .NAME.lmdata-convert) that "
    "interrupted tokenize and convert jobs keep for --resume; without it they are listed, kept.",
)
@click.option(
    "--older-than",
    default="1h",
    show_default=True,
    metavar="AGE",
    help="Only what has not changed for AGE (90, 30s, 15m, 2h, 1d; 0 for everything): a "
    "running writer's own objects are recent.",
)
@storage_option
def command(
    path: str,
    dry_run: bool,
    claims: bool,
    resumable: bool,
    older_than: str,
    storage_options: dict[str, Any] | None,
) -> None:
    """Find and remove what failed writes left below PATH (a folder or URL, searched
    recursively, and the claim beside it): .lmdata-tmp-* staged outputs; with --claims, the
    claims of writers that are gone (a commit they began is finished); with --resumable,
    interrupted tokenize/convert jobs' staging (listed and kept otherwise: rerun the job with
    --resume to finish it)."""
    found = clean(
        path,
        older_than=parse_age(older_than),
        claims=claims,
        resumable=resumable,
        dry_run=dry_run,
        storage_options=storage_options,
    )
    for item in found:
        kept = "" if item.remove else "  (kept: --resumable removes it)"
        click.echo(
            f"{item.kind:<10}  {_age(item.age):>6}  {human_bytes(item.bytes):>10}  {item.url}{kept}"
        )
    gone = [i for i in found if i.remove]
    total = human_bytes(sum(i.bytes for i in gone))
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {len(gone)} leftover(s), {total}", err=True)
