"""``lmdata stats PATH``: counts, lengths, frequent tokens and breakdowns of any dataset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from lmdata import _json
from lmdata._deps import require
from lmdata.cli._common import (
    DatasetPath,
    format_option,
    split_option,
    storage_option,
    text_key_option,
    tokenizer_option,
    unsafe_pickle_option,
)
from lmdata.cli._progress import shown
from lmdata.inspect.stats import SAMPLE_RECORDS, SAMPLE_TOKENS


def _output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A file to write later: its folder must exist now, before any data is read."""
    if value is not None:
        folder = os.path.dirname(os.path.abspath(value))
        if not os.path.isdir(folder):
            raise click.BadParameter(f"folder {folder!r} does not exist", ctx=ctx, param=param)
    return value


@click.command("stats")
@click.argument("path", type=DatasetPath())
@format_option
@storage_option
@split_option
@tokenizer_option(
    "Show the text of the frequent token ids: 'bytes' or a tokenizer file (as tokenize); "
    "default: the one that made the dataset, when it records one and the file is found."
)
@text_key_option
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as one JSON object.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    callback=_output_file,
    help="Also write histograms to this PNG (needs pip install 'lmdata[plot]').",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    callback=_output_file,
    help="Also write a self-contained HTML report with histograms to this file.",
)
@click.option("--full", is_flag=True, help="Read every record and token instead of a sample.")
@click.option(
    "--sample-records",
    type=click.IntRange(min=1),
    default=SAMPLE_RECORDS,
    show_default=True,
    help="Record datasets with more records are sampled (at random, --seed).",
)
@click.option(
    "--sample-tokens",
    type=click.IntRange(min=1),
    default=SAMPLE_TOKENS,
    show_default=True,
    help="Token datasets with more tokens count token ids in random windows of this many "
    "tokens in all (counts and lengths stay exact).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample.")
@click.option(
    "--top", type=click.IntRange(min=0), default=20, show_default=True, help="Token ids to list."
)
@click.option(
    "--bins", type=click.IntRange(min=1), default=30, show_default=True, help="Histogram bins."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress (bar or log lines).")
@unsafe_pickle_option
def command(
    path: str,
    fmt: str | None,
    storage_options: dict[str, Any] | None,
    split: str | None,
    tokenizer: str | None,
    text_key: str,
    as_json: bool,
    plot_path: str | None,
    html_path: str | None,
    full: bool,
    sample_records: int,
    sample_tokens: int,
    seed: int,
    top: int,
    bins: int,
    quiet: bool,
    reader_options: dict[str, Any],
) -> None:
    """Statistics of the dataset at PATH (any format): records, tokens, bytes, the
    distribution of record lengths, the most frequent token ids, and per-source and
    per-attribute breakdowns (Dolma trees). Large datasets are sampled and the output says
    so; --full reads everything."""
    from lmdata.inspect import report
    from lmdata.inspect.stats import compute

    if plot_path:
        require("matplotlib", "--plot (a PNG; --html needs nothing extra)")
    with shown(quiet) as progress:
        s = compute(
            path,
            format=fmt,
            split=split,
            tokenizer=tokenizer,
            storage_options=storage_options,
            reader_options=reader_options,
            text_key=text_key,
            full=full,
            sample_records=sample_records,
            sample_tokens=sample_tokens,
            seed=seed,
            top=top,
            bins=bins,
            progress=progress,
        )
    if plot_path:
        report.plot_png(s, plot_path)
    if html_path:
        Path(html_path).write_text(report.html_page(s), encoding="utf-8")
    if as_json:
        click.echo(_json.dumps(s, indent=True).decode())
    else:
        click.echo(report.text(s))
        for what, p in (("plot", plot_path), ("report", html_path)):
            if p:
                click.echo(f"{what}: {p}")
