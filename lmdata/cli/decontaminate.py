"""``lmdata decontaminate``: flag the spans of documents that match evaluation text."""

from __future__ import annotations

from typing import Any

import click

from lmdata.cli._common import engine_options, resumable_on_interrupt, storage_option
from lmdata.cli._progress import shown
from lmdata.dolma.cli_support import build, show_config


@click.command("decontaminate")
@click.option(
    "-c",
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="A config file (YAML or JSON) with the keys documents, against, text_key, ngram, "
    "name, document_dir, processes, work_dir; flags below override it.",
)
@click.option(
    "--documents", "-d", multiple=True, help="Document globs or a dataset folder (repeatable)."
)
@click.option(
    "--against",
    "-a",
    multiple=True,
    help="Evaluation files (globs, repeatable): JSONL (.jsonl/.json, also .gz/.zst) and Parquet "
    "read the --text-key field of each record; any other file is one plain text.",
)
@click.option(
    "--text-key",
    default=None,
    help="The field (JSONL) or column (Parquet) of the evaluation text [default: text].",
)
@click.option(
    "--ngram",
    type=click.IntRange(1, 64),
    default=None,
    help="Words per n-gram, after lower-casing and folding punctuation and whitespace "
    "(line breaks too) [default: 13]. Evaluation texts with fewer words are skipped (counted).",
)
@click.option(
    "--name",
    default=None,
    help="The attributes folder and attribute key written [default: decontam].",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes (default 1); the result is the same for any number.",
)
@click.option(
    "--work-dir",
    "work_dir",
    default=None,
    help="Where the job keeps its work (default: the system temp folder, or beside the "
    "attributes on an object store).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue a job stopped part way: only the unfinished units run again; the output "
    "is the same. A resume whose inputs, options or evaluation n-grams changed is refused.",
)
@click.option("--dryrun", is_flag=True, help="Print the resolved config; do nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@engine_options
@storage_option
def command(
    config: str | None,
    documents: tuple[str, ...],
    against: tuple[str, ...],
    text_key: str | None,
    ngram: int | None,
    name: str | None,
    processes: int | None,
    work_dir: str | None,
    resume: bool,
    dryrun: bool,
    quiet: bool,
    engine: str,
    address: str | None,
    storage_options: dict[str, Any] | None,
) -> None:
    """Write attributes/<name>/ beside each documents folder: for each document the
    character spans [[start, end, 1.0], ...] covered by word n-grams that occur in the
    evaluation texts ([] when none). Matching ignores case, punctuation and how lines are
    wrapped, and finds evaluation passages anywhere in long documents; `lmdata mix` can then
    drop or redact them (span_replacement).

    Example: lmdata decontaminate -d 'ds/documents/*.jsonl.gz' --against 'evals/*.jsonl'
    """
    from lmdata.dolma._decontam_config import DecontamConfig
    from lmdata.dolma.decontam import decontaminate

    flags = {
        "documents": documents,
        "against": against,
        "text_key": text_key,
        "ngram": ngram,
        "name": name,
        "processes": processes,
        "work_dir": work_dir,
    }
    data = build(config, flags, ())
    cfg = DecontamConfig.from_dict(data)
    if dryrun or data.get("dryrun"):
        show_config(data)
        return
    with resumable_on_interrupt(), shown(quiet) as progress:
        res = decontaminate(
            cfg,
            progress=progress,
            engine=engine,
            address=address,
            storage_options=storage_options,
            resume=resume,
        )
    click.echo(
        f"{res.contaminated:,} of {res.documents:,} documents match evaluation text "
        f"({res.spans:,} spans); {res.eval_ngrams:,} distinct {cfg.ngram}-grams from "
        f"{res.eval_texts:,} evaluation texts ({res.short_texts:,} shorter than {cfg.ngram} "
        f"words, skipped); {res.files} files, {res.seconds:.1f} s, "
        f"{res.docs_per_second:,.0f} documents/s -> attributes/{cfg.name}/"
    )
