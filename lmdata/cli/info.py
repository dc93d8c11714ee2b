"""``lmdata info PATH``: what a dataset holds, and what made it."""

from __future__ import annotations

from typing import Any

import click

from lmdata import _json
from lmdata._api import info
from lmdata._units import human_bytes
from lmdata.cli._common import DatasetPath, format_option, storage_option
from lmdata.cli._progress import shown

SHOWN_SPECIAL = 8  # special tokens listed in the text output (--json has them all)


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


def _provenance_lines(prov: dict[str, Any], needed: int | None) -> list[str]:
    t = prov.get("tokenizer") or {}
    out = ["made by:", f"  lmdata {prov.get('lmdata_version')}: {prov.get('command')}"]
    out.append("tokenizer:")
    out.append(f"  kind: {t.get('kind')}")
    if t.get("name"):
        where = f"at {t['path']}" if t.get("path") else "given as an object, not saved"
        out.append(f"  file: {t['name']}  ({where})")
        out.append(f"  sha256: {t.get('sha256')}")
    if isinstance(t.get("vocab_size"), int):
        out.append(f"  vocab_size: {t['vocab_size']:,}")
    for k in ("eod_id", "bos_id"):
        out.append(f"  {k}: {t[k] if t.get(k) is not None else 'none'}")
    out.append(f"  special tokens added: {'yes' if t.get('special_tokens_added') else 'no'}")
    special = t.get("special_tokens") or {}
    if special:
        listed = ", ".join(f"{k} {v}" for k, v in list(special.items())[:SHOWN_SPECIAL])
        more = ""
        if len(special) > SHOWN_SPECIAL:
            more = f", ... ({len(special):,} in all; --json lists them)"
        out.append(f"  special tokens: {listed}{more}")
    if needed is not None:
        rounded = -(-needed // 128) * 128
        out.append(
            f"a model needs a vocabulary of at least {needed:,} (rounded up to a multiple "
            f"of 128: {rounded:,})"
        )
    return out


@click.command("info")
@click.argument("path", type=DatasetPath())
@format_option
@storage_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object instead of text (with model_vocab_size: the vocabulary a "
    "model needs, from the recorded tokenizer and the largest id stored).",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="No progress on stderr (it counts the bytes of data summarised or scanned).",
)
def command(
    path: str,
    fmt: str | None,
    storage_options: dict[str, Any] | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Show a dataset's format, splits, sequence and token counts, codecs and size on disk,
    and for token datasets lmdata made, the tokenizer and command that made them.

    Formats whose counts take a pass over the data (Dolma, JSONL, the largest id of a .pbin)
    show progress on stderr; stdout holds only the summary."""
    with shown(quiet, leave=False, delay=0.5) as progress:
        summary = info(path, format=fmt, storage_options=storage_options, progress=progress)
    needed = summary.pop("model_vocab_size", None)
    if as_json:
        if needed is not None:
            summary["model_vocab_size"] = needed
        click.echo(_json.dumps(summary, indent=True).decode())
        return
    prov = summary.pop("provenance", None)
    lines = _lines(summary)
    if isinstance(prov, dict):
        lines += _provenance_lines(prov, needed)
    elif needed is not None:
        lines.append(f"a model needs a vocabulary of at least {needed:,} (the largest id + 1)")
    click.echo("\n".join(lines))
