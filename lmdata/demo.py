"""The main job on a corpus every machine has: the Python standard library's own sources.

standard-library ``.py`` files -> a Dolma tree -> tokenized (built-in byte tokenizer) into every
token format -> converted across formats -> every output validated -> shuffled packed batches
read back. Used by ``make demo`` / ``lmdata demo``.
"""

from __future__ import annotations

import sysconfig
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lmdata import formats
from lmdata._api import info, validate, writer
from lmdata._api import open as open_dataset
from lmdata.convert import convert
from lmdata.loader import Loader
from lmdata.protocols import is_token_reader
from lmdata.tokenize import ByteTokenizer
from lmdata.tokenize.api import tokenize

# the byte tokenizer maps byte b to b + 1, so id 0 is free to mark document ends
EOD_ID = 0


def stdlib_documents(limit: int | None = None) -> Iterator[tuple[str, str]]:
    """(relative path, text) of the standard library's non-empty ``.py`` files, sorted.

    Empty files (``__init__.py`` mostly) are left out: MDS cannot store an empty token array,
    and the demo converts into every format.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py") if "site-packages" not in f.parts)
    files = [f for f in files if f.stat().st_size > 0]
    for f in files[:limit]:
        yield str(f.relative_to(root)), f.read_text(encoding="utf-8", errors="replace")


def _timed(log: Callable[[str], None], what: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    log(f"  {what}: {time.perf_counter() - t0:.1f} s")
    return out


def _table(rows: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    log("")
    log(
        f"{'dataset':26} {'format':17} {'records':>8} {'tokens':>12} {'MB':>7} {'B/token':>7} "
        f"{'read Mtok/s':>11}  valid"
    )
    for r in rows:
        tokens = f"{r['tokens']:,}" if "tokens" in r else "-"
        rate = f"{r['Mtok/s']:.0f}" if "Mtok/s" in r else "-"
        width = f"{r['MB'] * 1e6 / r['tokens']:.2f}" if r.get("tokens") else "-"
        log(
            f"{r['dataset']:26} {r['format']:17} {r['records']:8,} {tokens:>12} "
            f"{r['MB']:7.1f} {width:>7} {rate:>11}  {r['valid']}"
        )


COLUMNS = """
What the columns measured
  records      what a reader of the dataset holds: documents, or token sequences (for
               flat-tokens, its train split only)
  tokens       token ids stored ('-' for datasets of documents; MDS and Atlas outputs of
               tokenize hold token arrays in a column, read with token_column="tokens")
  MB           bytes on disk, indexes and metadata included
  B/token      bytes on disk per token: the width each format stores ids in (flat-tokens
               uint32, as seqax writes it; Modalities and MDS the narrowest width that fits)
               plus indexes
  read Mtok/s  lmdata.Loader: shuffled packed batches of {batch} x {seq_len} tokens, {steps} steps
  valid        lmdata validate: every invariant of the format checked"""


def _explain(out: Path, docs: int, rows: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    """Why the numbers in the table differ, computed from the datasets just written."""
    by_name = {r["dataset"]: r for r in rows}
    splits = info(out / "stdlib.flat-tokens").get("splits", {})
    train, val = splits.get("train", {}), splits.get("validation", {})
    pbin = by_name["stdlib.pbin"].get("tokens", 0)
    val_tokens, train_tokens = val.get("tokens", 0), train.get("tokens", 0)
    reasons = [
        f"flat-tokens put {val.get('sequences', 0):,} of {docs:,} documents (by a hash of each "
        f"id, --validation-fraction 0.02) in its validation split: "
        f"{train.get('sequences', 0):,} train + {val.get('sequences', 0):,} validation.",
        f"Modalities appends an end-of-document token (id {EOD_ID}) to every document: "
        f"stdlib.pbin has {pbin:,} tokens = {train_tokens:,} (train) + {val_tokens:,} "
        f"(validation) + {pbin - train_tokens - val_tokens:,} EOD. flat-tokens and MDS add "
        "none: a sequence start is a bit (flat-tokens) or a sample (MDS).",
        "from-flat.pbin holds the flat-tokens train split only (Modalities has no splits), and a "
        "conversion adds no EOD; from-pbin.flat-tokens keeps its source's EOD tokens.",
        "B/token: flat-tokens stores 4 bytes per id; stdlib.pbin 2 (the width Modalities derives "
        "from the tokenizer's vocabulary of 257); from-flat.pbin 1 (a conversion has no "
        "tokenizer, so the width comes from the largest id stored).",
    ]
    log("\nWhy the counts differ")
    for r in reasons:
        log(textwrap.fill(r, 96, initial_indent="  - ", subsequent_indent="    "))


def _next_steps(out: Path, log: Callable[[str], None]) -> None:
    o = out
    log(f"\nOutputs are in {out}/ (replaced on each run). Try next:")
    for cmd, what in (
        (
            f"lmdata info {o}/stdlib.flat-tokens",
            "splits, counts, codecs, bytes, and the tokenizer and command that made it",
        ),
        (f"lmdata stats {o}/stdlib.dolma --html stats.html", "lengths and sources, as a report"),
        (
            f"lmdata cat {o}/stdlib.pbin -n 1 --decode",
            "a document as text (with the tokenizer the dataset records)",
        ),
        (f"lmdata view {o}/stdlib.flat-tokens", "browse it on 127.0.0.1, decoded"),
        (f"lmdata convert {o}/stdlib.pbin my.mds --to mds", "any format into any other"),
    ):
        log(f"  {cmd}\n      {what}")


def _split_for(src: Path, fmt: str) -> str | None:
    """The split to convert: a source with fixed splits the target lacks gives its first
    (flat-tokens' train split into Modalities), else every split (None)."""
    source, target = formats.spec(formats.detect(src)), formats.spec(fmt)
    return source.splits[0] if set(source.splits) - set(target.splits) else None


def run(
    out: Path,
    *,
    limit: int | None = None,
    seq_len: int = 2048,
    batch_size: int = 32,
    steps: int = 100,
    workers: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the whole path into ``out`` (replacing what a previous run left there)."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    # 1. documents -> a Dolma tree
    dolma = out / "stdlib.dolma"
    log("1. standard library sources -> Dolma tree")

    def write_dolma() -> int:
        n = 0
        with writer(dolma, "dolma", overwrite=True, source="python-stdlib") as w:
            for doc_id, text in stdlib_documents(limit):
                w.write(
                    {
                        "id": doc_id,
                        "text": text,
                        "source": "python-stdlib",
                        "metadata": {"path": doc_id},
                    }
                )
                n += 1
        return n

    docs = _timed(log, "write", write_dolma)
    # 2. tokenize into every token format
    log("2. tokenize the Dolma tree into every token format (byte tokenizer)")
    targets = {
        "flat-tokens": (out / "stdlib.flat-tokens", {"validation_fraction": 0.02}),
        "modalities": (out / "stdlib.pbin", {"eod_id": EOD_ID}),
        "mds": (out / "stdlib.mds", {}),
        "atlas": (out / "stdlib.atlas", {}),
    }
    for fmt, (dst, opts) in targets.items():
        s = _timed(
            log,
            f"-> {fmt}",
            lambda fmt=fmt, dst=dst, opts=opts: tokenize(
                dolma, dst, format=fmt, workers=workers, overwrite=True, **opts
            ),
        )
        if s.documents_written != docs:
            raise SystemExit(f"{fmt}: wrote {s.documents_written} of {docs} documents")
    # 3. convert across formats
    log("3. convert across formats")
    conversions = [
        (out / "stdlib.pbin", out / "from-pbin.flat-tokens", "flat-tokens"),
        (out / "stdlib.flat-tokens", out / "from-flat.pbin", "modalities"),
        (dolma, out / "docs.mds", "mds"),
        (dolma, out / "docs.atlas", "atlas"),
        (out / "docs.mds", out / "docs.jsonl", "modalities-jsonl"),
    ]
    for src, dst, fmt in conversions:
        _timed(
            log,
            f"{src.name} -> {dst.name}",
            lambda src=src, dst=dst, fmt=fmt: convert(
                src,
                dst,
                fmt,
                workers=workers,
                overwrite=True,
                split=_split_for(src, fmt),
            ),
        )
    # 4. validate everything, and read batches from every token dataset
    log("4. validate every output; read shuffled packed batches")
    tok = ByteTokenizer()
    tokenized = {dst for fmt, (dst, _) in targets.items() if formats.spec(fmt).kind == "records"}
    for path in [dolma, *(t[0] for t in targets.values()), *(c[1] for c in conversions)]:
        problems = validate(path)
        summary = info(path)
        row: dict[str, Any] = {
            "dataset": path.name,
            "format": summary.get("format", "?"),
            "valid": "ok" if not problems else f"{len(problems)} problems",
            "MB": summary.get("bytes_on_disk", 0) / 1e6,
        }
        # tokenize wrote {"tokens": ids} records into the record formats: read their tokens
        reader = open_dataset(path, token_column="tokens" if path in tokenized else None)
        row["records"] = len(reader)
        if is_token_reader(reader):
            loader = Loader(reader, seq_len=seq_len, global_batch_size=batch_size, seed=1234)
            t0 = time.perf_counter()
            for step in range(steps):
                loader.batch(step)
            dt = time.perf_counter() - t0
            row["tokens"] = reader.num_tokens
            row["Mtok/s"] = steps * batch_size * seq_len / dt / 1e6
        rows.append(row)
        if problems:
            for p in problems[:5]:
                log(f"    {path.name}: {p}")
    _table(rows, log)
    log(COLUMNS.format(batch=batch_size, seq_len=seq_len, steps=steps))
    _explain(out, docs, rows, log)
    shown = open_dataset(out / "stdlib.flat-tokens")  # its train split, as a Loader reads it
    first = Loader(shown, seq_len=seq_len, global_batch_size=batch_size, seed=1234).batch(0)
    log(
        f"\nfirst row of step 0 of a Loader over stdlib.flat-tokens ({shown.split} split, "
        f"shuffled packed rows of {seq_len:,} tokens, seed 1234) starts: "
        f"{tok.decode(first['targets'][0][:60])!r}"
    )
    _next_steps(out, log)
    bad = [r for r in rows if r["valid"] != "ok"]
    if bad:
        raise SystemExit(f"{len(bad)} outputs failed validation")
    return {"documents": docs, "datasets": rows}
