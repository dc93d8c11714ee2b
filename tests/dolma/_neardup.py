"""Generated near-duplicate corpora with known answers, for the MinHash tests and
bench/bench_minhash.py: documents of random words, copies edited to a chosen Jaccard of their
word 5-gram sets, and a brute-force oracle of what MinHash dedupe must flag."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import orjson

from lmdata.dolma import _shingle

_WORD = re.compile(r"[^\W_]+")


def ngram_set(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """The word n-grams of ``text`` as lmdata normalises it (ASCII text: lower-cased runs of
    letters and digits), computed independently of lmdata (a text with 1..n-1 words is one
    n-gram of them all)."""
    w = [m.group().lower() for m in _WORD.finditer(text)]
    if 0 < len(w) < n:
        return {tuple(w)}
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def jaccard(a: str, b: str, n: int = 5) -> float:
    x, y = ngram_set(a, n), ngram_set(b, n)
    return len(x & y) / len(x | y) if x | y else 0.0


def vocabulary(rng: np.random.Generator, size: int = 20_000) -> list[str]:
    return [
        "".join(chr(97 + c) for c in rng.integers(0, 26, int(rng.integers(3, 10))))
        for _ in range(size)
    ]


def render(words: list[str], rng: np.random.Generator, width: int = 0) -> str:
    """Words as text: punctuation here and there, wrapped every ``width`` words (0: random
    line lengths)."""
    out = []
    for i, w in enumerate(words):
        out.append(w)
        if rng.random() < 0.08:
            out[-1] += "," if rng.random() < 0.7 else "."
        line = width or 12
        out.append("\n" if (i + 1) % line == 0 else " ")
    return "".join(out).strip()


def edit(words: list[str], target: float, rng: np.random.Generator, vocab: list[str]) -> list[str]:
    """A copy of ``words`` with substitutions, insertions and deletions until the Jaccard of
    the 5-gram sets falls to about ``target``."""
    out = list(words)
    n = len(words) - 4
    # each edit far from the others changes about 5 n-grams: J ~ (n - 5e) / (n + 5e)
    edits = max(1, round(n * (1 - target) / (5 * (1 + target))))
    for _ in range(edits):
        at = int(rng.integers(0, len(out)))
        op = rng.random()
        if op < 0.5:
            out[at] = vocab[int(rng.integers(0, len(vocab)))]
        elif op < 0.75:
            out.insert(at, vocab[int(rng.integers(0, len(vocab)))])
        elif len(out) > 10:
            del out[at]
    return out


def corpus(
    seed: int, originals: int, copies: int, words: tuple[int, int] = (80, 300)
) -> tuple[list[dict], list[tuple[int, int, float]]]:
    """``originals`` unrelated documents and ``copies`` edited copies of some of them (at
    Jaccard 0.5-0.95, re-wrapped, re-cased, some with boilerplate appended), shuffled:
    (documents in order, (earlier, later, exact Jaccard) of each known pair)."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    base = [
        [vocab[int(k)] for k in rng.integers(0, len(vocab), int(rng.integers(*words)))]
        for _ in range(originals)
    ]
    texts = [render(w, rng) for w in base]
    src = rng.choice(originals, size=copies, replace=False)
    for s in src.tolist():
        w = edit(base[s], float(rng.uniform(0.5, 0.95)), rng, vocab)
        t = render(w, rng, width=8 if rng.random() < 0.5 else 0)
        if rng.random() < 0.3:
            t = t.upper()
        if rng.random() < 0.2:
            t += "\n\nsubscribe to our newsletter for more stories like this one"
        texts.append(t)
    order = rng.permutation(len(texts))
    docs = [{"id": f"d{i}", "text": texts[k]} for i, k in enumerate(order.tolist())]
    where = {k: i for i, k in enumerate(order.tolist())}
    pairs = []
    for c, s in enumerate(src.tolist()):
        a, b = sorted((where[s], where[originals + c]))
        pairs.append((a, b, jaccard(docs[a]["text"], docs[b]["text"])))
    return docs, pairs


def write_tree(root: Path, docs: list[dict], files: int = 3, gz: bool = False) -> None:
    """``docs`` in order over ``files`` JSONL files under ``root/documents`` (the last
    gzipped when ``gz``)."""
    import gzip

    d = root / "documents"
    d.mkdir(parents=True)
    per = -(-len(docs) // files)
    for k in range(files):
        data = b"".join(orjson.dumps(x) + b"\n" for x in docs[k * per : (k + 1) * per])
        if gz and k == files - 1:
            (d / f"part-{k}.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (d / f"part-{k}.jsonl").write_bytes(data)


def oracle(
    texts: list[str], n: int, bands: int, rows: int, threshold: float, seed: int
) -> set[int]:
    """What MinHash dedupe flags, by brute force over every pair: candidates share a band key
    (lmdata's signatures; every pair of a key's documents, as lmdata checks for keys shared by
    at most 17 documents), confirmed by the exact Jaccard of the 5-gram sets computed here;
    every document of a component but its first."""
    fns = _shingle.HashFunctions.make(bands * rows, seed)
    keys, counts, _ = _shingle.sign(texts, n, fns, rows)
    sets = [ngram_set(t, n) for t in texts]
    parent = list(range(len(texts)))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if not counts[i] or not counts[j] or not (keys[i] == keys[j]).any():
                continue
            if threshold > 0 and len(sets[i] & sets[j]) < threshold * len(sets[i] | sets[j]):
                continue
            a, b = root(i), root(j)
            parent[max(a, b)] = min(a, b)
    return {i for i in range(len(texts)) if root(i) != i}


def flagged(root: Path, name: str, attribute: str) -> list[int]:
    """The places (in input order) of the documents flagged in ``attributes/<name>/``."""
    out = []
    i = 0
    for f in sorted((root / "attributes" / name).iterdir()):
        import gzip

        raw = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
        for line in raw.splitlines():
            if orjson.loads(line)["attributes"].get(attribute):
                out.append(i)
            i += 1
    return out
