"""``lmdata dedupe``: flag exact duplicate documents or paragraphs, or near-duplicate documents
(MinHash-LSH), as dolma attributes."""

from __future__ import annotations

from typing import Any

import click

from lmdata.cli._common import engine_options, resumable_on_interrupt, storage_option
from lmdata.cli._progress import shown
from lmdata.dolma.cli_support import DolmaCommand, build, config_path, show_config
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.dedupe import dedupe


@click.command("dedupe", cls=DolmaCommand)
@click.option(
    "-c",
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="dolma dedupe config (YAML or JSON); flags below override it.",
)
@click.option("--documents", "-d", multiple=True, help="Document globs or a dataset folder.")
@click.option("--dedupe.name", "name", default=None, help="Attributes folder to write.")
@click.option(
    "--dedupe.documents.key",
    "doc_key",
    default=None,
    help="Dedupe whole documents by this JSONPath string, e.g. $.metadata.url.",
)
@click.option(
    "--dedupe.documents.attribute_name",
    "doc_attr",
    default=None,
    help="Attribute key for duplicate documents (e.g. bff_duplicate_url).",
)
@click.option(
    "--dedupe.paragraphs.attribute_name",
    "par_attr",
    default=None,
    help="Dedupe paragraphs; attribute key for their spans.",
)
@click.option(
    "--dedupe.minhash.attribute_name",
    "mh_attr",
    default=None,
    help="Flag near-duplicate documents (MinHash-LSH); attribute key for them, e.g. "
    "minhash_duplicate. Settings: --dedupe.minhash.ngram_size (5), .num_bands (14), "
    ".band_size (8), .jaccard_threshold (0.8; 0 = no exact check), .seed (0).",
)
@click.option(
    "--dedupe.min_length",
    "min_length",
    type=int,
    default=None,
    help="Skip keys shorter than this (paragraph chars / document key bytes).",
)
@click.option(
    "--dedupe.min_words", "min_words", type=int, default=None, help="Skip keys with fewer words."
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
    help="Where hash buckets are spilled (default: the system temp folder).",
)
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any config key (dotted)."
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue a job stopped part way (a kill, Ctrl-C, a lost worker): every run keeps "
    "its work in a folder named by the job and marks each finished unit, so --resume redoes "
    "only the unfinished units; the output is the same. A resume whose inputs (size, local "
    "mtime) or options changed is refused; a run without --resume starts afresh (discarding "
    "a stopped run's work).",
)
@click.option("--dryrun", is_flag=True, help="Print the resolved config; dedupe nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@engine_options
@storage_option
@click.pass_context
def command(
    ctx: click.Context,
    config: str | None,
    documents: tuple[str, ...],
    name: str | None,
    doc_key: str | None,
    doc_attr: str | None,
    par_attr: str | None,
    mh_attr: str | None,
    min_length: int | None,
    min_words: int | None,
    processes: int | None,
    work_dir: str | None,
    sets: tuple[str, ...],
    resume: bool,
    dryrun: bool,
    quiet: bool,
    engine: str,
    address: str | None,
    storage_options: dict[str, Any] | None,
) -> None:
    """Write attributes/<name>/ flagging every copy but the first (in input order).

    dolma's options all apply: dedupe.num_partitions + partition_index (a run considers the
    keys of its hash partition; attributes/<name>_<i>/), dedupe.file_partition (a run also
    takes only the files of its partition, as dolma), dedupe.document_dir, and
    bloom_filter.file: lmdata's exact key file instead of a Bloom filter (read if it exists,
    written with the run's keys; with bloom_filter.read_only only read: keys found there
    are flagged).

    dedupe.minhash flags near-duplicate documents instead: word n-grams after normalising
    case, punctuation and whitespace, MinHash-LSH bands, candidate pairs confirmed by the
    exact Jaccard of their n-gram sets; every document of a cluster but its first in input
    order gets {attribute_name: [[0, len(text), 1.0]]}. The same bytes for any processes,
    engine and range size; --resume as for the other modes.

    Example: lmdata dedupe -d 'ds/documents/*.gz' --dedupe.name dedupe_docs
    --dedupe.documents.key '$.metadata.url' --dedupe.documents.attribute_name bff_duplicate_url

    Example: lmdata dedupe -d 'ds/documents/*.gz' --dedupe.name fuzzy
    --dedupe.minhash.attribute_name minhash_duplicate --dedupe.minhash.jaccard_threshold 0.8
    """
    flags = {
        "documents": documents,
        "dedupe.name": name,
        "dedupe.documents.key": doc_key,
        "dedupe.documents.attribute_name": doc_attr,
        "dedupe.paragraphs.attribute_name": par_attr,
        "dedupe.minhash.attribute_name": mh_attr,
        "dedupe.min_length": min_length,
        "dedupe.min_words": min_words,
        "processes": processes,
        "work_dir": work_dir,
    }
    data = build(config_path(ctx, config), flags, sets)
    cfg = DedupeConfig.from_dict(data)  # a misspelled key fails a dry run too, as in dolma
    if dryrun or data.get("dryrun"):
        show_config(data)
        return
    with resumable_on_interrupt(), shown(quiet) as progress:
        res = dedupe(
            cfg,
            progress=progress,
            engine=engine,
            address=address,
            storage_options=storage_options,
            resume=resume,
        )
    if cfg.mode == "minhash":
        click.echo(
            f"{res.duplicates:,} near-duplicate documents of {res.documents:,} "
            f"({res.keys:,} with words), {res.files} files, {res.seconds:.1f} s, "
            f"{res.docs_per_second:,.0f} documents/s -> attributes/{cfg.out_name}/"
        )
        return
    click.echo(
        f"{res.duplicates:,} duplicate {cfg.mode} of {res.keys:,} keys in "
        f"{res.documents:,} documents, {res.files} files, {res.seconds:.1f} s, "
        f"{res.docs_per_second:,.0f} documents/s -> attributes/{cfg.out_name}/"
    )
    bloom = cfg.bloom_filter
    if bloom.writes:
        click.echo(f"key file (exact keys, lmdata's format) -> {bloom.file}")
