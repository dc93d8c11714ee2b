"""bench_tokenize's sections beyond the main table: the corpus and its trained 32k BPE, lmdata
runs, compressed and Parquet inputs, the phases of the fast path, pathological documents, the
Modalities pack CLI against modalities 0.5.0, convert throughput."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _compare import QUICK, record

HERE = Path(__file__).resolve().parent
MB = int(os.environ.get("BENCH_TOK_MB", 10 if QUICK else 30))  # corpus size
BIG_MB = int(os.environ.get("BENCH_TOK_BIG_MB", 60 if QUICK else 300))  # the large corpus
REPS = int(os.environ.get("BENCH_TOK_REPS", 1 if QUICK else 3))  # interleaved rounds
VOCAB = 32_000
SHARDS = 8  # the compressed and Parquet inputs: one unit each, so several files


def corpus_texts(limit: int) -> list[str]:
    """Local text files as documents, in sorted order, up to ``limit`` characters: two thirds
    the Python standard library's sources, one third /usr/share/doc (prose, changelogs)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    py = sorted(p for p in stdlib.rglob("*.py") if p.is_file() and "site-packages" not in p.parts)
    doc_suffixes = (".txt", ".md", ".rst", ".html", ".gz", "copyright", ".c", ".pl")
    docs = sorted(
        p
        for p in Path("/usr/share/doc").rglob("*")
        if p.is_file() and not p.is_symlink() and p.name.endswith(doc_suffixes)
    )
    out: list[str] = []
    size = 0
    for group, share in ((py, 2 / 3), (docs, 1.0)):
        for p in group:
            if size >= limit * share:
                break
            text = read_text(p)
            if text:
                out.append(text)
                size += len(text)
    return out


def read_text(p: Path) -> str:
    data = p.read_bytes()
    if p.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except OSError:
            return ""
    return data.decode("utf-8", "replace")


def make_corpus(root: Path) -> tuple[Path, list[str]]:
    texts = corpus_texts(MB * 10**6)
    src = root / "docs.jsonl"
    with open(src, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")
    return src, texts


def train_tokenizer(texts: list[str]) -> Path:
    """The 32k byte-level BPE of these texts (GPT-2 style, <|endoftext|> special), trained
    once per corpus and cached."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
    cache = HERE / "results" / ".cache" / f"bpe32k-{h.hexdigest()[:16]}"
    path = cache / "tokenizer.json"
    if path.exists():
        return path
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t0 = time.perf_counter()
    tok.train_from_iterator(texts, trainer)
    cache.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    # what transformers needs to load the folder (the Modalities pack's tokenizer)
    (cache / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"})
    )
    print(f"trained the 32k BPE in {time.perf_counter() - t0:.0f} s (cached: {cache})")
    return path


# ---- runs ------------------------------------------------------------------------------------


def one_core() -> None:
    """Pin the calling (child) process to one core: a "1 worker" or "1 thread" column means
    one core (a worker pipelines parsing and encoding on two threads, which would otherwise
    take a second core)."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def measured(argv: list[str], env: dict[str, str], pin: bool = False) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and all its children, stdout) of one run."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=True,
        env=env,
        preexec_fn=one_core if pin else None,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout


def lmdata_run(
    srcs: list[Path], dst: Path, tok: Path, encoder: str, workers: int
) -> tuple[float, float]:
    """(wall, CPU) seconds of ``lmdata tokenize`` (a fresh process, start-up included); one
    worker runs in the CLI's own process, pinned to one core, its encoder held to one thread."""
    argv = [sys.executable, "-m", "lmdata", "tokenize", *map(str, srcs), str(dst)]
    argv += ["--to", "flat-tokens", "--tokenizer", str(tok), "--encoder", encoder]
    argv += ["--workers", str(workers), "-q", "--overwrite"]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    if workers == 1:
        env["RAYON_NUM_THREADS"] = "1"
    wall, cpu, _ = measured(argv, env, pin=workers == 1)
    return wall, cpu


def compile_lmdata() -> None:
    """Byte-compile lmdata first, as an installed package is (with PYTHONDONTWRITEBYTECODE set,
    every run would otherwise compile its modules again: a tenth of a second of start-up)."""
    import compileall

    compileall.compile_dir(HERE.parent / "lmdata", quiet=1)


def big_corpus(src: Path, root: Path, mb: int) -> tuple[Path, int]:
    """``src``'s lines again and again, up to ``mb`` MB: (the file, its documents). The same
    text cycled: the encoders' word caches are warm after the first pass, as on a large
    corpus, where the per-byte cost of the pipeline shows."""
    data = src.read_bytes()
    lines = data.count(b"\n")
    big = root / "big.jsonl"
    n = max(1, -(-mb * 10**6 // len(data)))
    with open(big, "wb") as f:
        for _ in range(n):
            f.write(data)
    return big, n * lines


def flat_tokens(dst: Path) -> np.ndarray:
    """Every token id of a flat-tokens dataset, in order."""
    import lmdata

    r = lmdata.open(dst)
    return np.concatenate([np.asarray(x) for x in r]) if len(r) else np.zeros(0, np.uint32)


def crc(a: np.ndarray) -> int:
    import zlib

    return zlib.crc32(a.astype(np.uint32).tobytes())


# ---- the sections ----------------------------------------------------------------------------


def shards(root: Path, texts: list[str]) -> dict[str, list[Path]]:
    """The corpus as SHARDS files of plain, gzip and zstd JSONL, and Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    out: dict[str, list[Path]] = {"jsonl": [], "jsonl.gz": [], "jsonl.zst": [], "parquet": []}
    step = -(-len(texts) // SHARDS)
    for i in range(SHARDS):
        part = texts[i * step : (i + 1) * step]
        data = "".join(json.dumps({"text": t}) + "\n" for t in part).encode()
        for kind, payload in (
            ("jsonl", data),
            ("jsonl.gz", gzip.compress(data, 6)),
            ("jsonl.zst", zstandard.ZstdCompressor(level=3).compress(data)),
        ):
            d = root / kind
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:02d}.{kind}").write_bytes(payload)
            out[kind].append(d / f"{i:02d}.{kind}")
        d = root / "parquet"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": part}), d / f"{i:02d}.parquet")
        out["parquet"].append(d / f"{i:02d}.parquet")
    return out


def decompress_seconds(files: list[Path]) -> float:
    """Bare decompression (or Parquet read) of every shard, one core; the limit adds half of it
    (two cores)."""
    import pyarrow.parquet as pq
    import zstandard

    t0 = time.perf_counter()
    for f in files:
        if f.name.endswith(".gz"):
            gzip.decompress(f.read_bytes())
        elif f.name.endswith(".zst"):
            with zstandard.ZstdDecompressor().stream_reader(open(f, "rb")) as r:
                while r.read(1 << 22):
                    pass
        elif f.name.endswith(".parquet"):
            pq.read_table(f, columns=["text"])
        else:
            f.read_bytes()
    return time.perf_counter() - t0


def inputs_table(root: Path, tok: Path, texts: list[str], limit: float, want: int) -> None:
    files = shards(root / "shards", texts)
    print(f"\nthe same documents as {SHARDS} files of each kind, lmdata auto, 2 workers:")
    print(f"{'input':12} {'seconds':>8} {'limit s':>8} {'of limit':>9}")
    for kind, fs in files.items():
        dst = root / f"in-{kind}"
        runs = [lmdata_run(fs, dst, tok, "auto", 2)[0] for _ in range(max(1, REPS - 1))]
        s = statistics.median(runs)
        got = crc(flat_tokens(dst))
        lim = limit + decompress_seconds(fs) / 2
        assert got == want, (kind, got, want)
        record("bench_tokenize", f"{kind} input: of the limit", lim / s, unit="x")
        print(f"{kind:12} {s:8.2f} {lim:8.2f} {lim / s:8.2f}x")


def phases(src: Path, tok: Path) -> None:
    """Where the CPU goes on the fast path, phase by phase, one thread in this process (CPU
    time, so that other load on the machine does not inflate one phase): a worker's read,
    JSON parse, encode, id conversion (one array, uint16 when the ids fit), the reference's
    check of a sample, staging (a part written and read back), and the driver's write
    through the format's sink."""
    from lmdata.parallel.staging import LocalStaging
    from lmdata.tokenize import pipeline, worker
    from lmdata.tokenize.commit import pack_part, unpack_part
    from lmdata.tokenize.fast import load_fast
    from lmdata.tokenize.job import TokenizeJob
    from lmdata.tokenize.sinks import make_sink
    from lmdata.tokenize.sources import list_inputs, plan_units, range_bytes_for, read_batches

    fast = load_fast(str(tok))
    worker._TOKENIZER = fast  # what a worker's check compares with its reference
    job = TokenizeJob(to="flat-tokens", tokenizer=str(tok))
    inputs = list_inputs([src])
    units = plan_units(inputs, range_bytes_for(inputs))
    root = Path(tempfile.mkdtemp(prefix="phases-"))
    work = LocalStaging(str(root / "work"))
    work.reset(b"{}")
    sink = make_sink(job, fast.reference, "fast")(root / "out")
    names = ("read", "JSON parse", "encode", "id conversion", "reference check", "staging")
    t = dict.fromkeys((*names, "write (driver)"), 0.0)
    clock = time.thread_time
    enc = fast._encode
    n = 0
    for u in units:
        task = pipeline._task(job, inputs, work, u, check=True)
        check = worker._Check(task)
        t0 = clock()
        batches = list(read_batches(u, job.batch_docs))
        t["read"] += clock() - t0
        for seq, b in enumerate(batches):
            marks = [clock()]
            parsed = worker._parse_batch(task, b, 0)
            marks.append(clock())
            arrays = [enc(x) for x in parsed.texts]
            marks.append(clock())
            lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
            flat = worker._narrow(np.concatenate(arrays) if arrays else np.zeros(0, np.uint32))
            marks.append(clock())
            assert not check(seq, parsed, flat, lengths)
            marks.append(clock())
            meta = {"read": len(b.items), "skipped": [], "position": 0, "kind": "line"}
            arr = {"tokens": flat, "lengths": lengths, "validation": np.zeros(len(lengths), bool)}
            arr["pending"] = np.zeros((0, 2), np.int64)
            name = f"{n:06d}.tok"
            work.write_part(name, pack_part(arr, meta))
            got, _ = unpack_part(work.read_part(name), name)
            marks.append(clock())
            sink.write_many(got["tokens"], got["lengths"], got["validation"])
            marks.append(clock())
            steps = (*names[1:], "write (driver)")
            for k, a, z in zip(steps, marks[:-1], marks[1:], strict=True):
                t[k] += z - a
            n += 1
    t0 = clock()
    sink.close()
    t["write (driver)"] += clock() - t0
    shutil.rmtree(root, ignore_errors=True)
    total = sum(t.values())
    print("\nphases of the fast path, CPU s on one thread (staging: write and read back a part):")
    for k, v in t.items():
        record("bench_tokenize", f"phase {k}: share", v / total, higher_is_better=False)
        print(f"  {k:16} {v:6.2f} s  {100 * v / total:5.1f}%")
    print(f"  pipeline beyond the encoder: {(total - t['encode']) / t['encode']:.2f} of encode")


STARTUP = r"""
import sys, time
t = {"interpreter": (time.process_time(), time.perf_counter())}
def mark(step):
    t[step] = (time.process_time(), time.perf_counter())
import lmdata.cli.main, lmdata.cli.tokenize, lmdata.tokenize.pipeline
mark("imports")
from lmdata.tokenize import encoders, fast, tokenizers
from lmdata import _provenance
pre = fast.preload(sys.argv[1])  # as the job does: gigatoken parses on a thread meanwhile
ref = tokenizers.load_tokenizer(sys.argv[1])
f = fast.load_fast(sys.argv[1], ref, pre)
mark("load the reference and the fast encoder")
encoders.compare(f, ref, encoders.adversarial_sample(ref), False)
mark("check the adversarial sample")
_provenance.record(ref, None, False, "fast")
mark("provenance record")
last = (0.0, 0.0)
for k, v in t.items():
    print(f"{k}\t{v[0] - last[0]}\t{v[1] - last[1]}")
    last = v
"""


def startup(tok: Path) -> None:
    """CPU and wall seconds of the driver's start-up steps, in a fresh process (lmdata
    byte-compiled; the interpreter's wall time is not known from inside, so it shows 0)."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    rows = []
    for _ in range(REPS):
        out = measured([sys.executable, "-c", STARTUP, str(tok)], env)[2]
        rows.append(
            [(k, float(c), float(w)) for k, c, w in (x.split("\t") for x in out.splitlines())]
        )
    print(
        "\nthe driver's start-up, CPU and wall s (medians; the job's first documents are "
        "checked too):"
    )
    for i, (k, _, _) in enumerate(rows[0]):
        c = statistics.median(r[i][1] for r in rows)
        w = statistics.median(r[i][2] for r in rows) if i else 0.0
        record("bench_tokenize", f"start-up {k}: CPU s", c, higher_is_better=False, unit="s")
        print(f"  {k:40} CPU {c:6.3f} s  wall {w:6.3f} s")


PATHOLOGICAL = {
    '"a" * 10**6': lambda: "a" * 10**6,
    '"^" * 10**6': lambda: "^" * 10**6,
    "10 MB minified line": lambda: (
        "function f(a,b){return a+b};var x={k:[1,2,3],s:'str\\n'};if(x.k){f(1,2)}" * 140_000
    )[: 10 * 10**6],
    "1 MB of one emoji": lambda: "\U0001f642" * (10**6 // 4),
    "only whitespace (1 MB)": lambda: " \t\n \r\n  " * 125_000,
}


def pathological(tok: Path) -> None:
    from lmdata.tokenize.fast import load_fast

    fast = load_fast(str(tok))
    print("\npathological documents on the fast path (goal: each <= 1 s, ids equal):")
    for name, make in PATHOLOGICAL.items():
        text = make()
        t0 = time.perf_counter()
        got = fast.encode_batch([text])[0]
        s = time.perf_counter() - t0
        t0 = time.perf_counter()
        want = fast.reference.encode_batch([text])[0]
        hf = time.perf_counter() - t0
        equal = np.array_equal(got, want)
        record("bench_tokenize", f"pathological {name}: s", s, higher_is_better=False, unit="s")
        print(f"  {name:24} fast {s:6.3f} s   hf {hf:6.2f} s   ids equal: {equal}")
        assert equal, name


def modalities_pack(root: Path, tok: Path, texts: list[str]) -> None:
    """`lmdata modalities data pack_encoded_data` (auto) vs modalities 0.5.0's, same config,
    byte-identical .pbin; a tenth of the corpus (modalities encodes with HF)."""
    import envs
    import yaml

    env = envs.ensure("modalities")
    part = texts[: max(1, len(texts) // 10)]
    src = root / "mod.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    lm = [sys.executable, "-m", "lmdata", "modalities", "data"]
    pyenv = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    subprocess.run([*lm, "create_raw_index", str(src)], check=True, env=pyenv, capture_output=True)

    def config(dst: Path) -> Path:
        cfg = {
            "settings": {
                "src_path": str(src),
                "dst_path": str(dst),
                "index_path": str(src.with_suffix(".idx")),
                "jq_pattern": ".text",
                "num_cpus": 2,
                "eod_token": "<|endoftext|>",
                "processing_batch_size": 1000,
                "raw_samples_queue_size": 300,
                "processed_samples_queue_size": 300,
            },
            "tokenizer": {
                "component_key": "tokenizer",
                "variant_key": "pretrained_hf_tokenizer",
                "config": {
                    "pretrained_model_name_or_path": str(tok.parent),
                    "padding": False,
                    "truncation": False,
                },
            },
        }
        p = dst.with_suffix(".yaml")
        p.write_text(yaml.safe_dump(cfg))
        return p

    ours, theirs = root / "lm.pbin", root / "mod.pbin"
    rows = []
    for _ in range(max(1, REPS - 1)):
        ours.unlink(missing_ok=True)
        t0 = time.perf_counter()
        subprocess.run([*lm, "pack_encoded_data", str(config(ours))], check=True, env=pyenv,
                       capture_output=True)  # fmt: skip
        a = time.perf_counter() - t0
        if not env.ok:
            rows.append((a, None))
            continue
        theirs.unlink(missing_ok=True)
        t0 = time.perf_counter()
        argv = [str(env.python), "-m", "modalities", "data", "pack_encoded_data"]
        subprocess.run([*argv, str(config(theirs))], check=True, capture_output=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        b = time.perf_counter() - t0
        assert ours.read_bytes() == theirs.read_bytes(), "the .pbin files differ"
        rows.append((a, b))
    a = statistics.median(r[0] for r in rows)
    mb = src.stat().st_size / 1e6
    if not env.ok:
        print(f"\nModalities pack: lmdata {a:.2f} s; modalities 0.5.0 unavailable ({env.error})")
        return
    b = statistics.median(r[1] for r in rows)
    record("bench_tokenize", "modalities pack CLI: modalities / lmdata", b / a, unit="x")
    print(
        f"\nModalities pack_encoded_data CLI, {len(part):,} docs ({mb:.1f} MB), num_cpus 2, "
        f"byte-identical .pbin: lmdata (auto) {a:.2f} s, modalities 0.5.0 {b:.2f} s: "
        f"{b / a:.1f}x"
    )


def convert_lines(root: Path, src: Path, tok: Path, tokens: int) -> None:
    """convert's throughput from the corpus's flat-tokens output (made here: the main table's
    outputs are removed as they are checked)."""
    from lmdata.convert import convert

    source = root / "conv-src"
    lmdata_run([src], source, tok, "auto", 2)
    for to in ("flat-tokens", "modalities"):
        dst = root / f"conv-{to}"
        t0 = time.perf_counter()
        s = convert(source, dst, to, workers=1, split="train" if to != "flat-tokens" else None)
        dt = time.perf_counter() - t0
        record("bench_tokenize", f"convert flat-tokens -> {to}: seq/s", s.records / dt)
        print(
            f"convert flat-tokens -> {to}: {s.records:,} sequences in {dt:.2f} s "
            f"({tokens * 4 / dt / 1e6:.0f} MB/s of uint32 tokens)"
        )
