"""``lmdata tag``: run taggers over Dolma documents, writing row-aligned attribute files."""

from __future__ import annotations

from typing import Any

import click

from lmdata.cli._common import engine_options, storage_option
from lmdata.cli._progress import shown
from lmdata.dolma.cli_support import DolmaCommand, build, config_path, show_config
from lmdata.dolma.config import TagConfig
from lmdata.dolma.tag import tag
from lmdata.dolma.taggers import REGISTRY, load_modules


@click.command("tag", cls=DolmaCommand)
@click.option(
    "-c",
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="dolma tag config (YAML or JSON); flags below override it.",
)
@click.option(
    "--documents",
    "-d",
    multiple=True,
    help="Document globs ('ds/documents/*.jsonl.gz') or a dataset folder; repeatable.",
)
@click.option("--taggers", "-t", multiple=True, help="Tagger names; repeatable.")
@click.option(
    "--experiment",
    "-e",
    default=None,
    help="Write all taggers to attributes/EXPERIMENT/ with keys EXPERIMENT__tagger__"
    "type (default: one folder per tagger, experiment = tagger name).",
)
@click.option(
    "--tagger-modules",
    "--tagger_modules",
    "tagger_modules",
    multiple=True,
    help="A .py file or module defining your own taggers; repeatable.",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    default=None,
    help=(
        "Worker processes (one task per document file, or per 64 MiB of a large plain "
        "JSONL file). Default 1."
    ),
)
@click.option("--seed", type=int, default=None, help="Seed of random_number_v1 (default 0).")
@click.option(
    "--ignore-existing",
    "--ignore_existing",
    "ignore_existing",
    is_flag=True,
    default=None,
    help="Recompute files whose attributes already exist.",
)
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any config key (dotted)."
)
@click.option("--list", "list_taggers", is_flag=True, help="List the available taggers and exit.")
@click.option("--dryrun", is_flag=True, help="Print the resolved config; tag nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@engine_options
@storage_option
@click.pass_context
def command(
    ctx: click.Context,
    config: str | None,
    documents: tuple[str, ...],
    taggers: tuple[str, ...],
    experiment: str | None,
    tagger_modules: tuple[str, ...],
    processes: int | None,
    seed: int | None,
    ignore_existing: bool | None,
    sets: tuple[str, ...],
    list_taggers: bool,
    dryrun: bool,
    quiet: bool,
    engine: str,
    address: str | None,
    storage_options: dict[str, Any] | None,
) -> None:
    """Tag documents: attributes/<experiment or tagger>/ mirrors documents/ row for row.

    Example: lmdata tag --documents 'ds/documents/*.jsonl.gz' --taggers char_length_v1
    pii_regex_v2 --experiment exp. dolma's forms work too: `lmdata -c tag.yaml tag`, any config
    key as a dotted option, `--no-FLAG`.
    """
    if list_taggers:
        load_modules(tagger_modules)
        for name in sorted(REGISTRY):
            click.echo(name)
        return
    flags = {
        "documents": documents,
        "taggers": taggers,
        "experiment": experiment,
        "tagger_modules": tagger_modules,
        "processes": processes,
        "seed": seed,
        "ignore_existing": ignore_existing,
    }
    data = build(config_path(ctx, config), flags, sets)
    cfg = TagConfig.from_dict(data)  # a misspelled key fails a dry run too, as in dolma
    if dryrun or data.get("dryrun"):
        show_config(data)
        return
    with shown(quiet) as progress:
        res = tag(
            cfg, progress=progress, engine=engine, address=address, storage_options=storage_options
        )
    click.echo(
        f"tagged {res.documents:,} documents in {res.files - res.skipped_files} files "
        f"({res.skipped_files} already done) in {res.seconds:.1f} s, "
        f"{res.docs_per_second:,.0f} documents/s"
    )
