"""The main job on a corpus every machine has: the Python standard library's own sources.

Documents (``*.py`` files) -> byte-level tokens -> a flat-tokens dataset (train/validation)
-> validated -> shuffled packed batches read back. Used by ``make demo`` / ``lmdata demo``.
"""

from __future__ import annotations

import sysconfig
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lmdata._api import open as open_dataset
from lmdata._api import validate
from lmdata.formats.flat_tokens import Writer
from lmdata.loader import Loader
from lmdata.storage import disk_usage
from lmdata.tokenize import ByteTokenizer


def stdlib_documents(limit: int | None = None) -> Iterator[tuple[str, str]]:
    """(relative path, text) of the standard library's ``.py`` files, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py") if "site-packages" not in f.parts)
    for f in files[:limit]:
        yield str(f.relative_to(root)), f.read_text(encoding="utf-8", errors="surrogateescape")


def is_validation(doc_id: str, fraction: float) -> bool:
    """A stable split by a hash of the document id (independent of order and workers)."""
    return (zlib.crc32(doc_id.encode()) % 10_000) < fraction * 10_000


def run(
    out: Path,
    *,
    limit: int | None = None,
    seq_len: int = 2048,
    batch_size: int = 32,
    steps: int = 200,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    tok = ByteTokenizer()
    t0 = time.perf_counter()
    docs = nbytes = 0
    dst = out / "stdlib.flat-tokens"
    with Writer(dst, overwrite=True) as w:
        for doc_id, text in stdlib_documents(limit):
            ids = tok.encode(text)
            w.write(ids, split="validation" if is_validation(doc_id, 0.02) else "train")
            docs += 1
            nbytes += len(text.encode("utf-8", "surrogateescape"))
        counts = w.counts()
    t_write = time.perf_counter() - t0
    log(f"tokenized {docs:,} documents ({nbytes / 1e6:.1f} MB) in {t_write:.1f} s -> {dst}")
    for split, (n, t) in counts.items():
        log(f"  {split}: {n:,} sequences, {t:,} tokens")
    problems = validate(dst)
    log(f"validate: {'ok' if not problems else problems}")
    if problems:
        raise SystemExit(1)
    reader = open_dataset(dst, split="train")
    loader = Loader(reader, seq_len=seq_len, batch_size=batch_size, seed=1234)
    t0 = time.perf_counter()
    tokens = 0
    for step in range(steps):
        b = loader.batch(step)
        tokens += b["targets"].size
    dt = time.perf_counter() - t0
    first = loader.batch(0)
    log(
        f"read {steps} shuffled packed batches of {batch_size}x{seq_len}: "
        f"{tokens / dt / 1e6:.0f} Mtok/s ({steps * batch_size / dt:,.0f} rows/s)"
    )
    sample = tok.decode(first["targets"][0][:60])
    log(f"first row of step 0 starts: {sample!r}")
    summary = {
        "documents": docs,
        "tokens": sum(t for _, t in counts.values()),
        "bytes_on_disk": disk_usage(dst),
        "read_mtok_s": tokens / dt / 1e6,
    }
    log(
        f"summary: {summary['documents']:,} documents, {summary['tokens']:,} tokens, "
        f"{summary['bytes_on_disk'] / 1e6:.1f} MB on disk, {summary['read_mtok_s']:.0f} Mtok/s"
    )
    return summary
