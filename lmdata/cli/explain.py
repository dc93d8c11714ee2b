"""``lmdata explain DATASET... --step N``: where every row of a training batch came from."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import click

from lmdata.cli._common import DatasetPath, split_option

# the Loader settings a saved state holds, as the options name them
_FROM_STATE = (
    "seq_len",
    "global_batch_size",
    "mode",
    "seed",
    "shuffle",
    "epochs",
    "long_docs",
    "drop_last",
    "block_rows",
)


def _settings(options: dict[str, Any], state: dict[str, Any] | None) -> dict[str, Any]:
    """The Loader's keyword arguments: the options given, else the state's, else defaults."""
    out = {k: v for k, v in options.items() if v is not None}
    if state is not None:
        for k in _FROM_STATE:
            if k not in out and state.get(k) is not None:
                out[k] = state[k]
        if "weights" not in out and isinstance(state.get("weights"), list):
            out["weights"] = [Fraction(str(w)) for w in state["weights"]]
    for need in ("seq_len", "global_batch_size"):
        if need not in out:
            flag = "--" + need.replace("_", "-")
            raise click.UsageError(f"pass {flag} (or --state with a saved Loader state)")
    return out


@click.command("explain")
@click.argument("datasets", nargs=-1, required=True, type=DatasetPath())
@click.option(
    "--step",
    type=click.IntRange(min=0),
    default=None,
    help="The step to explain (default: the --state's step, else 0).",
)
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Tokens per row.")
@click.option(
    "--global-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Rows per step over all ranks.",
)
@click.option(
    "--mode",
    type=click.Choice(["packed", "bestfit", "eos", "unpacked"]),
    default=None,
    help="How rows are made (default: packed).",
)
@click.option("--seed", type=click.IntRange(min=0), default=None, help="The shuffle's seed.")
@click.option(
    "--weights",
    default=None,
    metavar="W1,W2,...",
    help="Mixture weights, one per dataset (default: their sizes).",
)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=None,
    help="A finite pass of this many epochs (an evaluation loader).",
)
@click.option(
    "--long-docs",
    type=click.Choice(["truncate", "split", "error"]),
    default=None,
    help="Documents longer than a row (default: split for bestfit, else truncate).",
)
@click.option(
    "--block-rows",
    type=click.IntRange(min=1),
    default=None,
    help="bestfit: rows per packing block (default 4096).",
)
@click.option(
    "--token-column",
    default=None,
    help="The column of token ids of a records dataset (default: the one its provenance names).",
)
@split_option
@click.option(
    "--state",
    "state_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A saved Loader state (JSON of Loader.state_dict()): its settings, mixture and step.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(
    datasets: tuple[str, ...],
    step: int | None,
    seq_len: int | None,
    global_batch_size: int | None,
    mode: str | None,
    seed: int | None,
    weights: str | None,
    epochs: int | None,
    long_docs: str | None,
    block_rows: int | None,
    token_column: str | None,
    split: str | None,
    state_file: str | None,
    as_json: bool,
) -> None:
    """Print the documents in each row of the global batch of a step: for every row its
    segments (dataset, document index, document id where recorded, token offset in the
    document, length), as the Loader with these settings serves them. Computed from the
    data order and the sequence index: any step, nothing stored."""
    from lmdata import _json
    from lmdata.loader import Loader

    state = None
    if state_file is not None:
        state = _json.read(state_file, what="Loader state", max_bytes=64 << 20)
    options = {
        "seq_len": seq_len,
        "global_batch_size": global_batch_size,
        "mode": mode,
        "seed": seed,
        "epochs": epochs,
        "long_docs": long_docs,
        "block_rows": block_rows,
        "weights": [float(w) for w in weights.split(",")] if weights else None,
    }
    kw = _settings(options, state)
    loader = Loader(
        list(datasets), token_column=token_column, split=split, rank=0, world_size=1, **kw
    )
    if state is not None:
        loader.load_state_dict(state)
    at = step if step is not None else loader.step
    lin = loader.explain(at)
    if as_json:
        out = lin.to_json()
        out["datasets"] = list(datasets)
        click.echo(_json.dumps(out).decode())
        return
    click.echo(f"step {at}: {lin.rows} rows of {loader.config.seq_len} tokens")
    for i, row in enumerate(lin):
        parts = []
        for s in row:
            name = f"{s.source}:" if len(datasets) > 1 else ""
            ident = f" id={s.id}" if s.id is not None else ""
            parts.append(f"{name}doc {s.document}{ident} [{s.offset}:{s.offset + s.length}]")
        used = sum(s.length for s in row)
        pad = f" + {loader.config.seq_len - used} padding" if used < loader.config.seq_len else ""
        click.echo(f"row {i}: " + ("; ".join(parts) or "padding") + pad)
