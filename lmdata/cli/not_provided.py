"""Origin-tool verbs lmdata does not provide (dolma's ``stat``, ``warc``, ``tokens``): running
one is an error that says what to use instead, not click's bare "No such command"."""

from __future__ import annotations

from typing import Any

import click

from lmdata.errors import InvalidInputError

# verb -> what the user should run instead (also the verb's --help text)
NOT_PROVIDED: dict[str, str] = {
    "stat": (
        "`dolma stat` (histograms of attribute values) is not provided by lmdata. "
        "`lmdata stats DATASET` reports a Dolma tree's per-attribute records, spans and "
        "min/mean/max (with --full: every file); for dolma's histogram files run dolma itself."
    ),
    "warc": (
        "`dolma warc` (extracting documents from Common Crawl WARC files) is not provided by "
        "lmdata. Extract the documents with dolma warc (or trafilatura / resiliparse), then "
        "run `lmdata tag`, `lmdata dedupe` and `lmdata mix` on them."
    ),
    "tokens": (
        "`dolma tokens` is `lmdata tokenize` here, with its own options: `lmdata tokenize "
        "DOCUMENTS... DST --to flat-tokens|atlas|modalities|mds --tokenizer tokenizer.json` "
        "(see `lmdata tokenize --help`); dolma's raw memmap + .csv.gz output is not written."
    ),
}


def command_for(name: str) -> click.Command | None:
    """A command that only refuses, naming the alternative (None for other names)."""
    message = NOT_PROVIDED.get(name)
    if message is None:
        return None

    def refuse(**_: Any) -> None:
        raise InvalidInputError(message)

    return click.Command(
        name,
        callback=refuse,
        help=message,
        short_help="Not provided (the message says what to use instead).",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
    )
