"""``lmdata info PATH``: what a dataset holds."""

from __future__ import annotations

from typing import Any

import click
import orjson

from lmdata._api import info
from lmdata.cli._common import DatasetPath, format_option, storage_option
from lmdata.inspect.report import human_bytes


def _lines(d: dict[str, Any], indent: int = 0) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(" " * indent + f"{k}:")
            out.extend(_lines(v, indent + 2))
        else:
            if isinstance(v, int) and not isinstance(v, bool) and "bytes" in k:
                v = f"{v:,} ({human_bytes(v)})"
            elif isinstance(v, int) and not isinstance(v, bool):
                v = f"{v:,}"
            out.append(" " * indent + f"{k}: {v}")
    return out


@click.command("info")
@click.argument("path", type=DatasetPath())
@format_option
@storage_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def command(
    path: str, fmt: str | None, storage_options: dict[str, Any] | None, as_json: bool
) -> None:
    """Show a dataset's format, splits, sequence and token counts, codecs and size on disk."""
    summary = info(path, format=fmt, storage_options=storage_options)
    if as_json:
        click.echo(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo("\n".join(_lines(summary)))
