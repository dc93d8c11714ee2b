"""Object storage: random reads of small records through a loopback S3 server (moto).

Per format, a dataset of small records (~1 KB text, or 256 tokens) is written to s3:// on a
moto server on 127.0.0.1 and to local disk; then random records are read: cold (a new reader,
an empty cache) and warm (the same reads again). Measured where s3fs sends and receives:
bytes fetched / bytes the records hold, requests per read, and reads per second beside the
same reads on local disk. Two baselines read records of the same size at random offsets of one
data object: s3fs's own file object (``fs.open``, default block size: what most code does) and
a bare ranged GET per record (the least any reader can fetch).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

import lmdata

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _compare import record

QUICK = bool(os.environ.get("LMDATA_BENCH_QUICK"))
N = 2_000 if QUICK else 5_000  # records per dataset
READS = 100 if QUICK else 200  # random reads per measurement
TEXT = 1000  # bytes of text per record
TOKENS = 256  # tokens per sequence


class Wire:
    """Counts what this process's s3fs sends (requests) and receives (object bytes)."""

    def __init__(self) -> None:
        import s3fs

        self.requests = 0
        self.bytes = 0
        orig_call = s3fs.core.S3FileSystem._call_s3
        wire = self

        async def call(fs: Any, method: str, *a: Any, **kw: Any) -> Any:
            wire.requests += 1
            out = await orig_call(fs, method, *a, **kw)
            if method == "get_object":
                wire.bytes += int(out.get("ContentLength") or 0)
            return out

        s3fs.core.S3FileSystem._call_s3 = call

    def reset(self) -> tuple[int, int]:
        got = (self.requests, self.bytes)
        self.requests = self.bytes = 0
        return got


def _server() -> tuple[Any, str]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    for k, v in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ[k] = v
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return server, endpoint


def _records(rng: np.random.Generator) -> list[dict[str, Any]]:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    return [{"id": i, "text": rng.choice(letters, TEXT).tobytes().decode()} for i in range(N)]


def _write(fmt: str, url: str, opts: dict[str, Any], recs: list[dict[str, Any]]) -> None:
    tokens = fmt in ("flat-tokens", "modalities")
    with lmdata.writer(url, fmt, **opts) as w:
        for r in recs:
            if tokens:
                w.write(np.arange(r["id"], r["id"] + TOKENS, dtype=np.int64) % 50_000)
            else:
                w.write(r)


FORMATS: list[tuple[str, str, dict[str, Any], int]] = [
    # (row name, format, writer options, bytes a record holds)
    ("flat-tokens", "flat-tokens", {"chunk_tokens": 1 << 18}, TOKENS * 4),
    ("flat-tokens zstd", "flat-tokens", {"chunk_tokens": 1 << 16, "compression": "zstd"}, 0),
    ("mds", "mds", {}, TEXT),
    ("mds zstd", "mds", {"compression": "zstd"}, 0),
    ("modalities .pbin", "modalities", {"vocab_size": 50_000}, TOKENS * 2),
    ("jsonl", "jsonl", {}, TEXT),
]


def _used(fmt: str, item: Any) -> int:
    if isinstance(item, np.ndarray):
        return int(item.size) * (2 if fmt == "modalities" else 4)
    return len(item["text"].encode())


def _pass(r: Any, fmt: str, idx: list[int], wire: Wire | None) -> tuple[float, float, float]:
    """One pass of the reads: (reads/s, fetched/used, requests/read)."""
    if wire:
        wire.reset()
    used = 0
    t = time.perf_counter()
    for i in idx:
        used += _used(fmt, r[i])
    dt = time.perf_counter() - t
    req, got = wire.reset() if wire else (0, 0)
    return len(idx) / dt, got / max(used, 1), req / len(idx)


def _measure(url: str, local: str, fmt: str, idx: list[int], wire: Wire) -> dict[str, float]:
    """The same reads on S3 and on local disk, interleaved: cold (a new reader, its own empty
    share of the cache) once each, then warm (the same reads again) best of 15 each (a warm
    pass takes a few ms: one burst of another job must not cover them all)."""
    s3r, lr = lmdata.open(url, format=fmt), lmdata.open(local, format=fmt)
    c_rate, c_ratio, c_req = _pass(s3r, fmt, idx, wire)
    l_cold = _pass(lr, fmt, idx, None)[0]
    warm, l_warm = None, 0.0
    for _ in range(15):  # the machine is shared: pairs interleaved, best of each
        row = _pass(s3r, fmt, idx, wire)
        warm = row if warm is None or row[0] > warm[0] else warm
        l_warm = max(l_warm, _pass(lr, fmt, idx, None)[0])
    assert warm is not None
    w_rate, w_ratio, w_req = warm
    return {
        "c_ratio": c_ratio,
        "w_ratio": w_ratio,
        "c_req": c_req,
        "w_req": w_req,
        "c_rate": c_rate,
        "w_rate": w_rate,
        "l_cold": l_cold,
        "l_warm": l_warm,
    }


def _baselines(key: str, wire: Wire) -> list[tuple[str, float, float]]:
    """(name, fetched/used, requests/read) of records of TEXT bytes at random offsets of one
    object: s3fs's file object with its default block size, and a bare ranged GET each."""
    from lmdata.storage import resolve

    store, _ = resolve("s3://x")
    fs = store.fs
    size = int(fs.info(key)["size"])
    rng = np.random.default_rng(1)
    offs = rng.integers(0, max(1, size - TEXT), READS).tolist()
    rows = []
    wire.reset()
    for o in offs:
        with fs.open(key, "rb") as f:  # as code that opens per record does
            f.seek(o)
            f.read(TEXT)
    req, got = wire.reset()
    rows.append((f"s3fs fs.open ({fs.default_block_size >> 20} MiB blocks)", got, req))
    with fs.open(key, "rb") as f:  # one kept-open file object, random seeks
        for o in offs:
            f.seek(o)
            f.read(TEXT)
    req, got = wire.reset()
    rows.append(("s3fs one open file, random seeks", got, req))
    for o in offs:
        fs.cat_file(key, start=o, end=o + TEXT)
    req, got = wire.reset()
    rows.append(("bare ranged GET", got, req))
    return [(n, got / (TEXT * READS), req / READS) for n, got, req in rows]


def main() -> None:
    try:
        import s3fs  # noqa: F401
        from moto.server import ThreadedMotoServer  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e.name} is not installed (pip install 'lmdata[s3]' 'moto[server]')")
        return
    server, _ = _server()
    try:
        _run()
    finally:
        server.stop()


def _run() -> None:
    import s3fs

    wire = Wire()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    rng = np.random.default_rng(0)
    recs = _records(rng)
    idx = rng.integers(0, N, READS).tolist()
    print(
        f"{N} records, {READS} random reads; cold: a new reader (its own empty share of the "
        "cache), warm: the same reads again; local/s3: how many times the local reads/s\n"
        f"{'format':<18}{'fetched/used':>13}{'warm':>6}{'req/read':>9}{'warm':>6}"
        f"{'reads/s s3':>11}{'warm':>8}{'local':>9}{'warm':>8}{'local/s3':>9}{'warm':>6}"
    )
    biggest = ""
    with tempfile.TemporaryDirectory() as tmp:
        for name, fmt, opts, _ in FORMATS:
            url = f"s3://{bucket}/{name.replace(' ', '-').replace('.', '')}"
            local = str(Path(tmp) / name.replace(" ", "-"))
            try:
                _write(fmt, url, opts, recs)
                _write(fmt, local, opts, recs)
            except lmdata.errors.LmdataError as e:
                print(f"{name:<18} cannot be written here: {e}")
                continue
            m = _measure(url, local, fmt, idx, wire)
            record("bench_storage", f"{name}: warm reads/s s3", m["w_rate"], unit="reads/s")
            record("bench_storage", f"{name}: cold reads/s s3", m["c_rate"], unit="reads/s")
            # fetched bytes and local/s3 grow when the store path gets worse
            record("bench_storage", f"{name}: cold fetched/used", m["c_ratio"], False)
            record("bench_storage", f"{name}: warm local/s3", m["l_warm"] / m["w_rate"], False)
            print(
                f"{name:<18}{m['c_ratio']:>13.2f}{m['w_ratio']:>6.2f}{m['c_req']:>9.2f}"
                f"{m['w_req']:>6.2f}{m['c_rate']:>11.0f}{m['w_rate']:>8.0f}{m['l_cold']:>9.0f}"
                f"{m['l_warm']:>8.0f}{m['l_cold'] / m['c_rate']:>9.1f}"
                f"{m['l_warm'] / m['w_rate']:>6.1f}",
                flush=True,
            )
            if fmt == "mds" and not opts:
                biggest = max(
                    (k for k in s3fs.S3FileSystem().find(url.split("://")[1]) if "shard" in k),
                    key=lambda k: s3fs.S3FileSystem().info(k)["size"],
                )
    if biggest:
        print(f"\nbaselines: records of {TEXT} B at random offsets of one MDS shard")
        print(f"{'reader':<40}{'fetched/used':>14}{'req/read':>10}")
        for n, ratio, req in _baselines(biggest, wire):
            print(f"{n:<40}{ratio:>14.2f}{req:>10.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
