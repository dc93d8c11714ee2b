"""``decontaminate``: evaluation passages found in documents however they are wrapped, cased or
punctuated, with their exact character spans; evaluation files in JSONL, Parquet and plain
text; the same bytes for any worker count and range size; resume; the command line."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.dolma import decontam
from lmdata.dolma._decontam_config import DecontamConfig
from lmdata.dolma.decontam import decontaminate, decontaminate_paths
from lmdata.errors import CorruptDataError, InvalidInputError
from tests.dolma._units import Killed, counting

WORDS = [f"w{i}" for i in range(5000)]


def _passage(rng: np.random.Generator, n: int = 40) -> list[str]:
    return [f"eval{int(k)}" for k in rng.integers(0, 10**6, n)]


def _forms(words: list[str]) -> dict[str, str]:
    """The four ways a passage is injected: as is, re-wrapped to 8 words a line, upper case,
    its punctuation changed."""
    plain = " ".join(words)
    return {
        "verbatim": plain,
        "rewrapped": "\n".join(" ".join(words[i : i + 8]) for i in range(0, len(words), 8)),
        "cased": plain.upper(),
        "punctuated": ", ".join(f"({w})" if i % 3 else f"{w}!" for i, w in enumerate(words)),
    }


def _filler(rng: np.random.Generator, chars: int) -> str:
    out = []
    n = 0
    while n < chars:
        w = WORDS[int(rng.integers(0, len(WORDS)))]
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def _setup(root: Path, seed: int = 0) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """Evaluation passages (a JSONL file) and documents of about 20 KB, some holding one
    passage in one of the four forms: (documents, the span each injected one must get)."""
    rng = np.random.default_rng(seed)
    passages = [_passage(rng) for _ in range(12)]
    (root / "evals").mkdir(parents=True)
    rows = [orjson.dumps({"question": " ".join(p), "id": i}) for i, p in enumerate(passages)]
    (root / "evals" / "qa.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    docs, want = [], {}
    for i in range(24):
        text = _filler(rng, 20_000)
        if i % 2 == 0:
            form = list(_forms(passages[i // 2]).values())[i // 2 % 4]
            at = int(rng.integers(0, len(text)))
            at = text.rfind(" ", 0, at) + 1
            text = text[:at] + form + " " + text[at:]
            first = re.search(r"[^\W_]+", form)
            last = list(re.finditer(r"[^\W_]+", form))[-1]
            assert first is not None
            want[f"doc{i}"] = (at + first.start(), at + last.end())
        docs.append({"id": f"doc{i}", "text": text})
    d = root / "ds" / "documents"
    d.mkdir(parents=True)
    (d / "a.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in docs[:10]))
    (d / "b.jsonl.gz").write_bytes(
        gzip.compress(b"".join(orjson.dumps(x) + b"\n" for x in docs[10:]), mtime=0)
    )
    return docs, want


def _cfg(root: Path, **kw) -> DecontamConfig:
    d = {
        "documents": [str(root / "ds" / "documents" / "*")],
        "against": [str(root / "evals" / "*")],
        "text_key": "question",
        **kw,
    }
    return DecontamConfig.from_dict(d)


def _rows(root: Path, name: str = "decontam") -> list[dict]:
    out = []
    for f in sorted((root / "ds" / "attributes" / name).iterdir()):
        raw = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
        out += [orjson.loads(x) for x in raw.splitlines()]
    return out


def _bytes(root: Path, name: str = "decontam") -> dict[str, bytes]:
    """Each attribute file's rows (decompressed), the attribute named ``decontam``."""
    out = {}
    for p in sorted((root / "ds" / "attributes" / name).iterdir()):
        raw = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        out[p.name] = raw.replace(f'"{name}"'.encode(), b'"decontam"')
    return out


@pytest.mark.native
def test_passages_are_found_verbatim_rewrapped_cased_and_punctuated(tmp_path: Path) -> None:
    docs, want = _setup(tmp_path)
    res = decontaminate(_cfg(tmp_path), engine="inprocess")
    rows = _rows(tmp_path)
    assert [r["id"] for r in rows] == [d["id"] for d in docs]
    got = {r["id"]: r["attributes"]["decontam"] for r in rows}
    for d in docs:
        if d["id"] in want:
            s, e = want[d["id"]]
            assert got[d["id"]] == [[s, e, 1.0]], d["id"]  # the passage, first word to last
        else:
            assert got[d["id"]] == [], d["id"]
    assert (res.documents, res.contaminated, res.spans) == (24, 12, 12)
    assert (res.eval_texts, res.short_texts, res.eval_ngrams) == (12, 0, 12 * 28)


def test_separate_and_overlapping_matches() -> None:
    from lmdata.dolma import _shingle

    table = _shingle.Table.build(_shingle.grams(["a b c d", "x y z"], 3)[1])
    text = "A, B c D e. q x y z x y z end"
    d, s, e = _shingle.match([text, "nothing here", "b c d"], 3, table)
    assert d.tolist() == [0, 0, 0, 2]
    # overlapping n-grams make one span ("a b c", "b c d"); "x y z" twice are two, as the
    # n-grams between them ("y z x", "z x y") are not evaluation text
    assert [text[a:b] for a, b in zip(s[:3].tolist(), e[:3].tolist(), strict=True)] == [
        "A, B c D",
        "x y z",
        "x y z",
    ]


def test_evaluation_files_in_every_form(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = " ".join(f"tok{i}" for i in range(20))
    q = " ".join(f"other{i}" for i in range(20))
    r = " ".join(f"third{i}" for i in range(20))
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "a.jsonl.gz").write_bytes(gzip.compress(orjson.dumps({"text": p}) + b"\n\n"))
    pq.write_table(pa.table({"text": [q, None], "n": [1, 2]}), ev / "b.parquet")
    cut = r.index(" ", 60)
    (ev / "c.txt").write_text(r[:cut] + "\n" + r[cut + 1 :] + "\nno\n")  # one text, 2 lines
    (ev / "d.txt").write_text("yes")  # too short: no n-gram
    docs = tmp_path / "ds" / "documents"
    docs.mkdir(parents=True)
    texts = [f"before {p} after", f"x {q} y", f"{r}", "clean text here"]
    (docs / "x.jsonl").write_bytes(
        b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in enumerate(texts))
    )
    res = decontaminate_paths(str(docs / "*"), str(ev / "*"), ngram=8, engine="inprocess")
    assert (res.eval_texts, res.short_texts, res.contaminated) == (4, 1, 3)
    rows = [
        orjson.loads(x)
        for x in (tmp_path / "ds/attributes/decontam/x.jsonl").read_bytes().splitlines()
    ]
    got = [r["attributes"]["decontam"] for r in rows]
    assert got[0] == [[7, 7 + len(p), 1.0]] and got[3] == []
    assert got[2][0][:2] == [0, len(r)]


def test_bad_evaluation_input_is_named(tmp_path: Path) -> None:
    docs = tmp_path / "ds" / "documents"
    docs.mkdir(parents=True)
    (docs / "x.jsonl").write_bytes(b'{"id": 1, "text": "a b c"}\n')
    ev = tmp_path / "ev.jsonl"
    ev.write_bytes(b'{"text": "fine"}\n{"prompt": "no text"}\n')
    with pytest.raises(CorruptDataError, match=r"ev\.jsonl.*line 2|line 2.*ev\.jsonl"):
        decontaminate_paths(str(docs / "*"), str(ev), engine="inprocess")
    ev.write_bytes(b'{"text": "fine"}\n{not json\n')
    with pytest.raises(CorruptDataError, match="line 2"):
        decontaminate_paths(str(docs / "*"), str(ev), engine="inprocess")
    with pytest.raises(InvalidInputError, match="no evaluation files"):
        decontaminate_paths(str(docs / "*"), str(tmp_path / "none*.jsonl"), engine="inprocess")
    pq = tmp_path / "ev.parquet"
    pq.write_bytes(b"PAR1 not really")
    with pytest.raises(CorruptDataError, match="Parquet"):
        decontaminate_paths(str(docs / "*"), str(pq), engine="inprocess")
    with pytest.raises(InvalidInputError, match="against"):
        DecontamConfig.from_dict({"documents": ["x"]})
    with pytest.raises(InvalidInputError, match="unknown key ngrams"):
        DecontamConfig.from_dict({"documents": ["x"], "against": ["y"], "ngrams": 3})


def test_any_worker_count_and_range_size_writes_the_same_bytes(tmp_path: Path) -> None:
    _setup(tmp_path)
    decontaminate(_cfg(tmp_path, name="one"), engine="inprocess")
    decontaminate(_cfg(tmp_path, name="two", processes=2), engine="processes", range_bytes=9000)
    assert _bytes(tmp_path, "one") == _bytes(tmp_path, "two")


def test_a_stopped_job_resumes_and_other_evaluations_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _setup(tmp_path)
    work = tmp_path / "w"
    decontaminate(_cfg(tmp_path, name="ref"), engine="inprocess", range_bytes=20_000)
    with pytest.MonkeyPatch.context() as mp:
        first = counting(mp, decontam, "phase_match", 2)
        with pytest.raises(Killed):
            decontaminate(
                _cfg(tmp_path, work_dir=str(work)), engine="inprocess", range_bytes=20_000
            )
    assert len(first) == 2
    ev = tmp_path / "evals" / "qa.jsonl"
    saved = ev.read_bytes()
    ev.write_bytes(saved + orjson.dumps({"question": " ".join(WORDS[:30])}) + b"\n")
    with pytest.raises(InvalidInputError, match="options evals changed"):
        decontaminate(
            _cfg(tmp_path, work_dir=str(work)), engine="inprocess", range_bytes=20_000, resume=True
        )
    ev.write_bytes(saved)
    again = counting(monkeypatch, decontam, "phase_match")
    decontaminate(
        _cfg(tmp_path, work_dir=str(work)), engine="inprocess", range_bytes=20_000, resume=True
    )
    ran = {k for t in again for k, _ in t.spans}
    assert not ran & {k for t in first for k, _ in t.spans} and ran
    assert _bytes(tmp_path) == _bytes(tmp_path, "ref") and list(work.iterdir()) == []


def test_the_command_line_and_its_config_file(tmp_path: Path) -> None:
    _setup(tmp_path)
    args = ["decontaminate", "-d", str(tmp_path / "ds" / "documents" / "*"), "-q"]
    args += ["--against", str(tmp_path / "evals" / "*.jsonl"), "--text-key", "question"]
    r = CliRunner().invoke(cli, [*args, "--engine", "inprocess"])
    assert r.exit_code == 0, r.output
    assert "12 of 24 documents match evaluation text (12 spans)" in r.output
    first = _bytes(tmp_path)
    cfg = tmp_path / "decontam.yaml"
    cfg.write_text(
        f"documents: ['{tmp_path}/ds/documents/*']\nagainst: ['{tmp_path}/evals/*']\n"
        "text_key: question\nngram: 13\nname: fromfile\nprocesses: 2\n"
    )
    r = CliRunner().invoke(cli, ["decontaminate", "-c", str(cfg), "-q"])
    assert r.exit_code == 0, r.output
    assert _bytes(tmp_path, "fromfile") == first
    r = CliRunner().invoke(cli, ["decontaminate", "-c", str(cfg), "--dryrun"])
    assert r.exit_code == 0 and "text_key: question" in r.output
    helped = CliRunner().invoke(cli, ["decontaminate", "--help"]).output
    for opt in ("--against", "--text-key", "--ngram", "--name", "--resume", "--engine"):
        assert opt in helped
    r = CliRunner().invoke(cli, ["decontaminate", "-d", "x"])
    assert r.exit_code == 2 and "against" in r.output


def test_rows_are_orjsons_bytes() -> None:
    from lmdata.dolma import _shingle

    table = _shingle.Table.build(_shingle.grams(["match me here"], 3)[1])
    ids = ["x", 3, None, {"b": 1, "a": [1, 2]}, 'q"uote']
    texts = ["nothing", "so match me here!", "", "MATCH me, here", "no"]
    spans = [[], [[3, 16, 1.0]], [], [[0, 14, 1.0]], []]
    rows, hit, n = decontam._rows(ids, texts, 3, table, 'na"me')
    want = [
        orjson.dumps({"attributes": {'na"me': s}, "id": i}, option=orjson.OPT_SORT_KEYS) + b"\n"
        for i, s in zip(ids, spans, strict=True)
    ]
    assert rows == b"".join(want)
    assert (hit, n) == (2, 2)


def test_documents_on_s3_get_the_local_bytes(tmp_path: Path, s3_root: str) -> None:
    from lmdata.storage import resolve

    _setup(tmp_path)
    decontaminate(_cfg(tmp_path), engine="inprocess", range_bytes=20_000)
    store, key = resolve(s3_root)
    for p in sorted((tmp_path / "ds" / "documents").iterdir()):
        store.put(f"{key}/documents/{p.name}", p.read_bytes())
    cfg = DecontamConfig.from_dict(
        {
            "documents": [f"{s3_root}/documents/*"],
            "against": [str(tmp_path / "evals" / "*")],
            "text_key": "question",
        }
    )
    decontaminate(cfg, engine="inprocess", range_bytes=20_000)
    local = tmp_path / "ds" / "attributes" / "decontam"
    got = {
        n: store.read(f"{key}/attributes/decontam/{n}")
        for n in store.list(f"{key}/attributes/decontam")
    }
    assert got == {p.name: p.read_bytes() for p in sorted(local.iterdir())}
    assert sorted(store.list(key)) == [
        "attributes",
        "documents",
        "lmdata-manifest",
    ]  # no work folder left
