"""``lmdata tokenize SRC... DST --to FORMAT``: documents to a token dataset."""

from __future__ import annotations

from typing import Any

import click

from lmdata.cli._common import (
    DatasetPath,
    FormatName,
    engine_options,
    say_resume,
    storage_option,
)
from lmdata.parallel.staging import staging_for
from lmdata.tokenize.api import tokenize


def _token_targets() -> list[str]:
    from lmdata import formats

    return formats.token_targets()


def _accepting(option: str) -> list[str]:
    from lmdata import formats

    return [s.name for s in formats.specs() if s.tokens and option in s.tokens.options]


@click.command("tokenize")
@click.argument("sources", nargs=-1, required=True, type=DatasetPath())
@click.argument("dst", type=click.Path())
@click.option("--to", "to", required=True, type=FormatName(_token_targets), help="Output format.")
@click.option(
    "--tokenizer",
    default="bytes",
    show_default=True,
    help="'bytes' (built-in, byte+1, no file), or a local file: tokenizer.json (Hugging Face), "
    "*.tiktoken (tiktoken BPE ranks), *.model (sentencepiece). Never downloaded.",
)
@click.option(
    "--encoder",
    type=click.Choice(["auto", "fast", "hf"]),
    default="auto",
    show_default=True,
    help="What encodes: fast (gigatoken, the lmdata[fast] extra; byte-level BPE "
    "tokenizer.json, *.tiktoken, sentencepiece BPE with byte fallback), hf (the tokenizer's "
    "own library: tokenizers, tiktoken, sentencepiece), or auto (fast when installed and it "
    "implements the tokenizer, else hf). fast is checked against hf before and during the "
    "job; the tokens are the same.",
)
@click.option(
    "--text-key",
    default="text",
    show_default=True,
    help="Field holding the text in JSONL, Parquet and record datasets.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="Worker processes (default: all cores; 0 runs in this process).",
)
@click.option(
    "--batch-docs",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Documents per work unit (a unit also ends after 1 MiB of input).",
)
@click.option(
    "--validation-fraction",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.0,
    show_default=True,
    help="Formats with a validation split (flat-tokens): share of documents (chosen by a "
    "hash of their id, or file and line) put in the validation split.",
)
@click.option(
    "--validation",
    "validation_sources",
    multiple=True,
    type=DatasetPath(),
    help="Formats with a validation split (flat-tokens): a separate validation source "
    "(repeatable).",
)
@click.option("--eod", default=None, help="End-of-document token, e.g. '<|endoftext|>'.")
@click.option("--eod-id", type=int, default=None, help="End-of-document token id.")
@click.option(
    "--append-eod/--no-eod",
    "append_eod",
    default=None,
    help="Append the EOD token after each document (default: the format's "
    "convention: modalities yes, others no).",
)
@click.option(
    "--special-tokens/--no-special-tokens",
    "add_special_tokens",
    default=None,
    help="Let the tokenizer add its special tokens (BOS/EOS of its post-processor). Default: "
    "the format's convention (modalities yes, as the origin; others no).",
)
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Skip malformed lines and documents without text, counting them, instead "
    "of stopping with an error.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted job: the parts of the inputs (local or URLs) already done "
    "are not tokenized again; the output is the same. An input whose size or version (mtime, "
    "ETag) changed is refused.",
)
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option(
    "--format",
    "-f",
    "source_format",
    default=None,
    help="Format of a SOURCE that is an lmdata dataset (detected by default).",
)
@click.option(
    "--chunk-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="flat-tokens: tokens per chunk file.",
)
@click.option(
    "--compression",
    default=None,
    help="flat-tokens: none (default), blosc, blosc-zstd, zstd, gzip; mds: zstd[:N], gz, bz2, "
    "br, snappy (default none). Other formats: not accepted.",
)
@storage_option
@click.option("--quiet", "-q", is_flag=True, help="No progress (bar or log lines).")
@engine_options
def command(
    sources: tuple[str, ...],
    dst: str,
    to: str,
    tokenizer: str,
    encoder: str,
    text_key: str,
    workers: int | None,
    batch_docs: int,
    validation_fraction: float,
    validation_sources: tuple[str, ...],
    eod: str | None,
    eod_id: int | None,
    append_eod: bool | None,
    add_special_tokens: bool | None,
    skip_invalid: bool,
    resume: bool,
    overwrite: bool,
    source_format: str | None,
    chunk_tokens: int | None,
    compression: str | None,
    storage_options: dict[str, Any] | None,
    quiet: bool,
    engine: str,
    address: str | None,
) -> None:
    """Tokenize the documents in SOURCES (JSONL[.gz|.zst] files or folders, Dolma trees,
    Modalities raw JSONL, Parquet, text files, or lmdata record datasets; local paths or
    URLs of files, folders and globs, which the workers read in place) into DST.

    The output is written atomically and is the same for any number of workers. Ctrl-C leaves
    no output; run again with --resume to continue.
    """
    from lmdata.cli._progress import shown

    for option, value in (("chunk_tokens", chunk_tokens), ("compression", compression)):
        if value is not None and to not in _accepting(option):
            flag = "--" + option.replace("_", "-")
            raise click.UsageError(f"{flag} applies to --to {' or '.join(_accepting(option))} only")
    opts: dict[str, object] = {}
    if chunk_tokens is not None:
        opts["chunk_tokens"] = chunk_tokens
    if compression is not None:
        opts["compression"] = None if compression == "none" else compression
    # -q: no bar at all (tqdm's import is a tenth of a small job's start-up)
    try:
        with shown(quiet) as progress:
            summary = tokenize(
                list(sources),
                dst,
                format=to,
                tokenizer=tokenizer,
                text_key=text_key,
                validation=list(validation_sources),
                validation_fraction=validation_fraction,
                eod=eod,
                eod_id=eod_id,
                append_eod=append_eod,
                special_tokens=add_special_tokens,
                skip_invalid=skip_invalid,
                source_format=source_format,
                batch_docs=batch_docs,
                encoder=encoder,
                workers=workers,
                engine=engine,
                address=address,
                resume=resume,
                overwrite=overwrite,
                progress=progress,
                storage_options=storage_options,
                writer_options=opts,
            )
    except (KeyboardInterrupt, Exception) as e:
        say_resume(e, lambda: staging_for(dst, storage_options))  # beside the output (or URL)
        raise
    for msg in summary.skipped:
        click.echo(f"skipped: {msg}", err=True)
    click.echo(summary.line())
