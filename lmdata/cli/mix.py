"""``lmdata mix -c config.yaml`` (or ``lmdata -c config.yaml mix``): dolma's mixer (filter,
span replacement, shards)."""

from __future__ import annotations

from typing import Any

import click
import orjson

from lmdata.cli._common import engine_options, storage_option
from lmdata.cli._progress import shown
from lmdata.dolma.cli_support import DolmaCommand, build, config_path
from lmdata.dolma.config import MixerConfig
from lmdata.dolma.mixer import mix, plan_shards
from lmdata.errors import InvalidInputError


@click.command("mix", cls=DolmaCommand)
@click.option(
    "-c",
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="dolma mixer config (YAML or JSON; also accepted before the verb, as dolma takes it); "
    "paths are relative to the current folder.",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    default=None,
    help="Shards mixed in parallel (default: the config's, else 1).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any top-level or dotted config key.",
)
@click.option("--dryrun", is_flag=True, help="Print the shards; write nothing.")
@click.option(
    "--strict",
    is_flag=True,
    help="Fail (exit 2) when a filter or span rule reads an attribute no document has, or "
    "the include filters match no document of a stream (a warning otherwise; checked as "
    "the documents are mixed, so the shards are written either way).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@engine_options
@storage_option
@click.pass_context
def command(
    ctx: click.Context,
    config: str | None,
    processes: int | None,
    sets: tuple[str, ...],
    dryrun: bool,
    strict: bool,
    quiet: bool,
    engine: str,
    address: str | None,
    storage_options: dict[str, Any] | None,
) -> None:
    """Mix documents as `dolma mix` does: same documents, order and texts, with
    metadata.provenance = "<file>:<line>". Existing output shards are kept (resume)."""
    path = config_path(ctx, config)
    if path is None and not sets:
        raise InvalidInputError("mix needs a config: lmdata -c mix.yaml mix (or mix -c mix.yaml)")
    data = build(path, {"processes": processes}, sets)
    # the options go into the config (not the printed data: they may hold secrets)
    cfg = MixerConfig.from_dict(
        {**data, "storage_options": storage_options} if storage_options else data
    )
    if dryrun or data.get("dryrun"):
        for s in cfg.streams:
            for sh in plan_shards(s):
                click.echo(
                    orjson.dumps(
                        {"stream": s.name, "output": sh.output, "inputs": list(sh.inputs)}
                    ).decode()
                )
        return
    with shown(quiet) as progress:
        res = mix(cfg, progress=progress, engine=engine, address=address, strict=strict)
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(
        f"read {res.read:,} documents, wrote {res.written:,} ({res.filtered:,} filtered "
        f"out, {res.too_short:,} too short) into {res.shards - res.skipped_shards} shards "
        f"({res.skipped_shards} existing kept) in {res.seconds:.1f} s, "
        f"{res.docs_per_second:,.0f} documents/s"
    )
