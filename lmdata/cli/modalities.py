"""``lmdata modalities data ...``: modalities' data commands, with its arguments and configs."""

from __future__ import annotations

import click

from lmdata.compat.modalities import POLICIES, create_raw_index, pack_encoded_data

_policy = click.option(
    "--file_existence_policy",
    "--file-existence-policy",
    "policy",
    type=click.Choice(POLICIES),
    default="error",
    show_default=True,
    help="What to do when the output exists: fail, keep it, or replace it.",
)


@click.group("modalities")
def command() -> None:
    """Modalities' command lines with `lmdata` in place of `modalities`."""


@command.group("data")
def data() -> None:
    """`modalities data` commands: create_raw_index, pack_encoded_data."""


@data.command("create_raw_index")
@click.argument("src_path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--index_path",
    "--index-path",
    "index_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write the index (default: SRC_PATH's stem + .idx beside it).",
)
@_policy
def create_raw_index_cmd(src_path: str, index_path: str | None, policy: str) -> None:
    """Index the lines of a JSONL file, byte-identical to modalities' create_raw_index."""
    res = create_raw_index(src_path, index_path, policy)
    if res is None:
        click.echo("index exists; skipped (--file_existence_policy skip)")
    else:
        click.echo(f"indexed {res.documents:,} documents -> {res.index_path}")


@data.command("pack_encoded_data")
@click.argument("config_path", type=click.Path(exists=True, dir_okay=False))
@_policy
@click.option(
    "--encoder",
    type=click.Choice(["auto", "fast", "hf"]),
    default="auto",
    show_default=True,
    help="What encodes (an lmdata option, as for `lmdata tokenize`): fast (gigatoken), hf "
    "(the tokenizer's own library) or auto (fast when installed and exact for the "
    "tokenizer). The .pbin is the same for each.",
)
def pack_encoded_data_cmd(config_path: str, policy: str, encoder: str) -> None:
    """Tokenize and pack the indexed JSONL file a modalities pack config names into a .pbin,
    byte-identical to modalities' pack_encoded_data. Queue-size keys are accepted and have no
    effect; any key lmdata does not implement is an error naming it."""
    res = pack_encoded_data(config_path, policy, encoder)
    if res is None:
        click.echo("output exists; skipped (--file_existence_policy skip)")
    else:
        click.echo(
            f"documents read {res.documents_read:,}, written {res.documents_written:,}, "
            f"skipped {res.documents_skipped:,}; {res.tokens:,} tokens -> {res.output} "
            f"(encoder {res.encoder})"
        )
