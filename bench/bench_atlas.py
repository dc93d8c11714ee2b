"""Atlas: bytes on disk, sequential and random reads for each strategy and block size.

Peers measured in the same run: the origin's read path (torch-atlas-ds is not installable here,
so its algorithm is re-implemented: seek + read + one-shot decompress + pickle.loads, with its
one-block cache per shard), plain per-example pickle files, the practical limit (every example
pickled back to back in one memory-mapped file with an offset array: no blocks, no
compression), and MDS (zstd) when lmdata.formats.mds works.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

import lmdata
from lmdata.storage import disk_usage

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _compare

N = 20_000
SHARD = 5_000
BLOCKS = (8, 32, 128, 1024)
STRATEGIES = {0: "none", 1: "standard", 2: "shared", 3: "dictionary"}
RAND = 3_000  # random single reads (stops early after RAND_SECONDS)
RAND_SECONDS = 0.6
TAKE = 2_000


def make_examples(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    vocab = np.array(
        [
            "the",
            "of",
            "model",
            "token",
            "data",
            "train",
            "café",
            "Ωmega",
            "loss",
            "shard",
            "block",
            "an",
            "ando",
            "zeru",
            "\n",
            "42",
            "€uro",
            "batch",
        ]
    )
    out = []
    for i in range(n):
        k = int(rng.integers(5, 160))
        out.append(
            {
                "id": i,
                "text": " ".join(vocab[rng.integers(0, len(vocab), k)]),
                "tags": ["news", "sport", "math"][: int(rng.integers(0, 4))],
                "score": round(float(rng.random()) * 1000, 3),
                "nested": {"a": rng.integers(-(10**6), 10**6, int(rng.integers(1, 4))).tolist()},
            }
        )
    return out


class OriginStyle:
    """torch-atlas-ds's AtlasDataset read path, per its research notes (for comparison)."""

    def __init__(self, root: Path) -> None:
        import bisect
        import json

        self._bisect = bisect.bisect_left
        meta = json.loads((root / "meta.json").read_text())
        shared = (
            (root / "zstd_dict.bin").read_bytes() if meta["compression_strategy"] == 2 else None
        )
        self.shards = []
        for d in sorted(p for p in root.iterdir() if p.is_dir()):
            m = json.loads((d / "meta.json").read_text())
            s = m["compression_strategy"]
            dd = None
            if s == 3:
                dd = zstandard.ZstdDecompressor(
                    dict_data=zstandard.ZstdCompressionDict((d / "zstd_dict.bin").read_bytes())
                )
            elif s == 2:
                dd = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(shared))
            elif s == 1:
                dd = zstandard.ZstdDecompressor()
            self.shards.append(
                {
                    "bs": m["block_size"],
                    "n": m["stored_examples"],
                    "dd": dd,
                    "index": np.load(d / "index.npy", mmap_mode="r"),
                    "f": open(d / "data.bin", "rb"),
                    "last": None,
                    "lb": None,
                }
            )
        self.cumsum = np.cumsum([s["n"] for s in self.shards]).tolist()

    def __getitem__(self, i: int) -> Any:
        s = self._bisect(self.cumsum, i + 1)
        sh = self.shards[s]
        j = i - (self.cumsum[s - 1] if s else 0)
        b, k = divmod(j, sh["bs"])
        if sh["lb"] != b:
            a, e = sh["index"][b : b + 2]
            sh["f"].seek(int(a))
            raw = sh["f"].read(int(e - a))
            if sh["dd"] is not None:
                raw = sh["dd"].decompress(raw)
            sh["last"], sh["lb"] = pickle.loads(raw), b
        return sh["last"][k]

    def close(self) -> None:
        for sh in self.shards:
            sh["f"].close()


class OriginWriter:
    """torch-atlas-ds's AtlasDatasetWriter, per its research notes (for comparison): blocks
    pickled with the default protocol, streamed to data.bin zstd-compressed; strategy 2 writes
    shard 0 as strategy 3 (blocks kept in RAM, a dictionary trained on all of them at close,
    single-threaded) and moves that dictionary to the root for the later shards."""

    def __init__(self, root: Path, shard_size: int, block_size: int, level: int = 3) -> None:
        root.mkdir()
        self.root, self.shard_size, self.block_size, self.level = (
            root,
            shard_size,
            block_size,
            level,
        )
        self.sizes: list[int] = []
        self.shared: zstandard.ZstdCompressionDict | None = None
        self._open(0)

    def _open(self, n: int) -> None:
        self.folder = self.root / str(n)
        self.folder.mkdir()
        self.n, self.count, self.block, self.blocks = n, 0, [], []
        self.offsets = [0]
        self.data: Any = None
        self.cctx = zstandard.ZstdCompressor(level=self.level, dict_data=self.shared)

    def _emit(self) -> None:
        raw = pickle.dumps(self.block)
        self.block = []
        if self.shared is None:  # shard 0: trained at close
            self.blocks.append(raw)
            return
        if self.data is None:
            self.data = open(self.folder / "data.bin", "wb")
        out = self.cctx.compress(raw)
        self.data.write(out)
        self.offsets.append(self.offsets[-1] + len(out))

    def write(self, x: Any) -> None:
        if self.count == self.shard_size:
            self._close_shard()
            self._open(self.n + 1)
        self.block.append(x)
        self.count += 1
        if len(self.block) == self.block_size:
            self._emit()

    def _close_shard(self) -> None:
        import json

        if self.block:
            self._emit()
        strategy = 2
        if self.shared is None:
            size = max(int(0.01 * sum(map(len, self.blocks))) + 1, 1024)
            d = zstandard.train_dictionary(size, self.blocks, level=self.level)
            cctx = zstandard.ZstdCompressor(level=self.level, dict_data=d)
            with open(self.folder / "data.bin", "wb") as f:
                for raw in self.blocks:
                    out = cctx.compress(raw)
                    f.write(out)
                    self.offsets.append(self.offsets[-1] + len(out))
            (self.root / "zstd_dict.bin").write_bytes(d.as_bytes())
            self.shared, self.blocks = d, []
        elif self.data is not None:
            self.data.close()
        dt = next(
            t
            for t in (np.uint8, np.uint16, np.uint32, np.uint64)
            if self.offsets[-1] <= np.iinfo(t).max
        )
        np.save(self.folder / "index.npy", np.asarray(self.offsets, dtype=dt))
        meta = {
            "version": 1,
            "block_size": self.block_size,
            "stored_examples": self.count,
            "compression_strategy": strategy,
            "compression_level": self.level,
            "compression_dict_size": 0.01,
        }
        (self.folder / "meta.json").write_text(json.dumps(meta, indent=4))
        self.sizes.append(self.count)

    def close(self) -> None:
        import json

        self._close_shard()
        meta = {"version": 1, "shard_sizes": self.sizes, "compression_strategy": 2}
        (self.root / "meta.json").write_text(json.dumps(meta, indent=4))
        width = len(str(len(self.sizes) - 1))
        for n in range(len(self.sizes)):
            (self.root / str(n)).rename(self.root / str(n).rjust(width, "0"))


class PickleFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def __getitem__(self, i: int) -> Any:
        with open(self.root / f"{i}.pkl", "rb") as f:
            return pickle.loads(f.read())


class Limit:
    """Every example pickled back to back in one file, memory-mapped, with offsets."""

    def __init__(self, root: Path) -> None:
        self.offsets = np.load(root / "offsets.npy").tolist()
        self.mm = np.memmap(root / "data.bin", dtype=np.uint8, mode="r")

    def __getitem__(self, i: int) -> Any:
        return pickle.loads(self.mm[self.offsets[i] : self.offsets[i + 1]])


def best(f: Callable[[], float], runs: int = 2) -> float:
    """The best of ``runs`` rates (the machine is shared; the best is the least disturbed)."""
    out = []
    for _ in range(runs):
        gc.collect()
        out.append(f())
    return max(out)


def rate(get: Callable[[int], Any], idx: list[int]) -> float:
    """Examples per second over ``idx`` (stopping after RAND_SECONDS)."""
    t0 = time.perf_counter()
    n = 0
    for i in idx:
        get(i)
        n += 1
        if n % 64 == 0 and time.perf_counter() - t0 > RAND_SECONDS:
            break
    return n / (time.perf_counter() - t0)


def timed(f: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def seq_rate(it: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    count = sum(1 for _ in it())
    assert count == n
    return n / (time.perf_counter() - t0)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-atlas-"))
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp: Path) -> None:
    ex = make_examples(N)
    rng = np.random.default_rng(1)
    rand_idx = rng.integers(0, N, RAND).tolist()
    take_idx = rng.integers(0, N, TAKE)
    raw_mb = sum(len(pickle.dumps(e, protocol=4)) for e in ex) / 1e6
    print(
        f"{N:,} dict examples, {raw_mb:.1f} MB pickled one by one; shards of {SHARD:,}; "
        f"{os.cpu_count()} CPUs; warm page cache. kex/s = thousands of examples per second."
    )
    print(
        "origin = torch-atlas-ds's read path re-implemented (the package is not on PyPI); "
        "rand = single random r[i] with the default 64 MiB cache (it holds this whole\n"
        "dataset's blocks), no cache = cache_bytes=0, as for a dataset far larger than the "
        "cache; take = one r.take() of 2,000 random indices.\n"
    )
    head = (
        f"{'strategy':<11}{'block':>6}{'MB disk':>9}{'write s':>8}{'seq kex/s':>11}"
        f"{'origin seq':>11}{'rand kex/s':>11}{'no cache':>9}{'origin rand':>12}{'x origin':>9}"
        f"{'take kex/s':>11}"
    )
    print(head)
    print("-" * len(head))
    for strategy, sname in STRATEGIES.items():
        for bs in BLOCKS:
            out = tmp / f"a{strategy}_{bs}"
            t0 = time.perf_counter()
            with lmdata.writer(
                out, "atlas", shard_size=SHARD, block_size=bs, compression_strategy=strategy
            ) as w:
                for e in ex:
                    w.write(e)
            wt = time.perf_counter() - t0
            r = lmdata.open(out)
            o = OriginStyle(out)
            seq = best(lambda r=r: seq_rate(lambda: iter(r), N))
            oseq = best(lambda o=o: seq_rate(lambda: (o[i] for i in range(N)), N))
            rnd = best(lambda r=r: rate(r.__getitem__, rand_idx))
            small = lmdata.open(out, cache_bytes=0)  # as if the dataset dwarfed the cache
            rnd0 = best(lambda r=small: rate(r.__getitem__, rand_idx))
            ornd = best(lambda o=o: rate(o.__getitem__, rand_idx))
            o.close()
            tk = best(lambda r=r: TAKE / timed(lambda: r.take(take_idx)))
            row = f"{sname} block {bs}"
            _compare.record("bench_atlas", f"{row}: write s", wt, higher_is_better=False)
            for col, v in (("seq", seq), ("rand", rnd), ("no cache", rnd0), ("take", tk)):
                _compare.record("bench_atlas", f"{row}: {col} ex/s", v, unit="ex/s")
            _compare.record("bench_atlas", f"{row}: rand x origin", rnd / ornd)
            print(
                f"{sname:<11}{bs:>6}{disk_usage(out) / 1e6:>9.1f}{wt:>8.2f}{seq / 1e3:>11.0f}"
                f"{oseq / 1e3:>11.0f}{rnd / 1e3:>11.1f}{rnd0 / 1e3:>9.1f}{ornd / 1e3:>12.1f}"
                f"{rnd / ornd:>9.2f}{tk / 1e3:>11.1f}",
                flush=True,
            )
            shutil.rmtree(out)
    print()
    workers(tmp, ex)
    print()
    peers(tmp, ex, rand_idx)


def workers(tmp: Path, ex: list[dict[str, Any]]) -> None:
    """Block compression on one thread vs all cores (level 12 makes compression dominate)."""
    blobs = [("x" * 64 + e["text"]) * 4 for e in ex]
    times = {}
    for w in (1, os.cpu_count() or 1):
        out = tmp / f"w{w}"
        t = timed(lambda w=w, out=out: _write(out, blobs, w))
        times[w] = t
        shutil.rmtree(out)
    line = ", ".join(f"workers={w}: {t:.2f} s" for w, t in times.items())
    print(f"write, standard zstd level 12, block 256, {len(blobs):,} strings: {line}")


def _write(out: Path, items: list[Any], w: int) -> None:
    with lmdata.writer(
        out,
        "atlas",
        shard_size=N,
        block_size=256,
        compression_strategy=1,
        compression_level=12,
        workers=w,
    ) as wr:
        for it in items:
            wr.write(it)


def peers(tmp: Path, ex: list[dict[str, Any]], rand_idx: list[int]) -> None:
    print(f"{'peer':<38}{'MB disk':>9}{'write s':>8}{'seq kex/s':>11}{'rand kex/s':>11}")
    # Plain per-example pickle files.
    d = tmp / "pkl"
    d.mkdir()
    t0 = time.perf_counter()
    for i, e in enumerate(ex):
        (d / f"{i}.pkl").write_bytes(pickle.dumps(e, protocol=4))
    wt = time.perf_counter() - t0
    p = PickleFiles(d)
    seq = seq_rate(lambda: (p[i] for i in range(N)), N)
    rnd = rate(p.__getitem__, rand_idx)
    print(
        f"{'per-example pickle files':<38}{disk_usage(d) / 1e6:>9.1f}{wt:>8.2f}"
        f"{seq / 1e3:>11.0f}{rnd / 1e3:>11.1f}"
    )
    shutil.rmtree(d)
    # The practical limit: one mmap'd file of back-to-back pickles and an offset array.
    d = tmp / "limit"
    d.mkdir()
    t0 = time.perf_counter()
    blobs = [pickle.dumps(e, protocol=4) for e in ex]
    (d / "data.bin").write_bytes(b"".join(blobs))
    np.save(d / "offsets.npy", np.concatenate([[0], np.cumsum([len(b) for b in blobs])]))
    wt = time.perf_counter() - t0
    lim = Limit(d)
    seq = seq_rate(lambda: (lim[i] for i in range(N)), N)
    rnd = rate(lim.__getitem__, rand_idx)
    print(
        f"{'limit: mmap of per-example pickles':<38}{disk_usage(d) / 1e6:>9.1f}{wt:>8.2f}"
        f"{seq / 1e3:>11.0f}{rnd / 1e3:>11.1f}"
    )
    # MDS (zstd), if that format works in this tree.
    try:
        d = tmp / "mds"
        t0 = time.perf_counter()
        with lmdata.writer(
            d,
            "mds",
            columns={
                "id": "int64",
                "text": "str",
                "tags": "json",
                "score": "float64",
                "nested": "json",
            },
            compression="zstd",
        ) as w:
            for e in ex:
                w.write(e)
        wt = time.perf_counter() - t0
        m = lmdata.open(d)
        assert m[7]["text"] == ex[7]["text"]
        seq = seq_rate(lambda: iter(m), N)
        rnd = rate(m.__getitem__, rand_idx)
        print(
            f"{'mds (zstd, lmdata)':<38}{disk_usage(d) / 1e6:>9.1f}{wt:>8.2f}"
            f"{seq / 1e3:>11.0f}{rnd / 1e3:>11.1f}"
        )
    except Exception as e:  # MDS is built concurrently; leave it out when it does not work
        print(f"{'mds':<38} skipped: {type(e).__name__}: {e}"[:140], file=sys.stdout)


if __name__ == "__main__":
    main()
