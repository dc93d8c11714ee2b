"""MinHash dedupe (``dedupe.minhash``): exact expectations on hand-built pairs at known
Jaccard, the brute-force oracle of tests/dolma/_neardup.py on generated corpora for any unit
sizes, the same bytes for any worker count, and the config's checks."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.cli.main import cli
from lmdata.dolma import _minhash_units as mu
from lmdata.dolma import _minhash_write as mw
from lmdata.dolma import minhash
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.dedupe import dedupe
from lmdata.errors import InvalidInputError
from tests.dolma import _neardup as nd

ATTR = "minhash_duplicate"


def _cfg(root: Path, name: str = "fz", threshold: float = 0.8, **kw) -> DedupeConfig:
    mh = {"attribute_name": ATTR, "jaccard_threshold": threshold, **kw}
    return DedupeConfig.from_dict(
        {"documents": [f"{root}/documents/*"], "dedupe": {"name": name, "minhash": mh}}
    )


def _rows(root: Path, name: str = "fz") -> list[dict]:
    out = []
    for f in sorted((root / "attributes" / name).iterdir()):
        raw = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
        out += [orjson.loads(x) for x in raw.splitlines()]
    return out


def _bytes(root: Path, name: str = "fz") -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "attributes" / name).iterdir())}


def _words(tag: str, n: int) -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def _changed(words: list[str], at: list[int]) -> list[str]:
    out = list(words)
    for i in at:
        out[i] = out[i] + "x"
    return out


def _hand_built(root: Path) -> list[tuple[str, str]]:
    """(id, text) in input order over two files, with their exact 5-gram Jaccard noted."""
    a = _words("a", 60)
    b = _words("b", 60)
    c1 = _words("c", 200)  # 196 n-grams
    c2 = _changed(c1, [20, 60, 100])  # J(c1, c2) = 181/211 = 0.858
    c3 = _changed(c2, [140, 170, 190])  # J(c2, c3) = 0.858, J(c1, c3) = 166/226 = 0.735
    d = _words("d", 60)
    docs = [
        ("a", " ".join(a)),
        ("b", " ".join(b)),
        ("c1", " ".join(c1)),
        ("d-second", "\n".join(d).upper()),  # file 1: earlier than its twin in file 2
        ("a-rewrapped", "\n".join(", ".join(a[i : i + 8]) for i in range(0, 60, 8)).title()),
        ("b-far", " ".join(_changed(b, [5, 15, 25, 35, 45]))),  # J = 31/81 = 0.38
        ("c2", " ".join(c2)),
        ("empty-1", ""),
        ("punct", "... --- !!!"),
        ("empty-2", ""),
        ("short-1", "Three Short Words"),
    ]
    docs2 = [
        ("c3", " ".join(c3)),
        ("short-2", "three, short; words!"),
        ("d-first", " ".join(d)),
        ("a-again", " ".join(a)),
    ]
    (root / "documents").mkdir(parents=True)
    for name, part in (("1.jsonl", docs), ("2.jsonl.gz", docs2)):
        data = b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in part)
        p = root / "documents" / name
        p.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return docs + docs2


def test_hand_built_pairs_at_known_jaccard(tmp_path: Path) -> None:
    docs = _hand_built(tmp_path)
    assert nd.jaccard(docs[2][1], docs[6][1]) == pytest.approx(181 / 211)
    assert nd.jaccard(docs[2][1], docs[11][1]) == pytest.approx(166 / 226)
    assert nd.jaccard(docs[1][1], docs[5][1]) == pytest.approx(31 / 81)
    res = dedupe(_cfg(tmp_path), engine="inprocess")
    rows = _rows(tmp_path)
    flagged = {r["id"] for r in rows if r["attributes"]}
    # identical after folding case, punctuation and wrapping; c3 through c2 (the cluster's
    # first is c1, though J(c1, c3) < 0.8); the short twins as one n-gram each; d's copy in
    # the first file is the one kept
    assert flagged == {"a-rewrapped", "a-again", "c2", "c3", "short-2", "d-first"}
    assert (res.documents, res.keys, res.duplicates) == (15, 12, 6)
    by_id = {r["id"]: r for r in rows}
    text = dict(docs)
    assert by_id["c3"]["attributes"] == {ATTR: [[0, len(text["c3"]), 1.0]]}
    assert by_id["c1"] == {"attributes": {}, "id": "c1"}
    assert [r["id"] for r in rows] == [i for i, _ in docs]  # rows in document order
    raw = (tmp_path / "attributes" / "fz" / "1.jsonl").read_bytes().splitlines()
    assert raw[4] == orjson.dumps(by_id["a-rewrapped"], option=orjson.OPT_SORT_KEYS)


def test_without_the_jaccard_check_candidates_are_pairs(tmp_path: Path) -> None:
    """threshold 0: every document sharing a band key with an earlier one is flagged: the
    Jaccard 0.74 pair is (the first of its cluster is c1 either way)."""
    _hand_built(tmp_path)
    dedupe(_cfg(tmp_path, threshold=0), engine="inprocess")
    texts = [r["text"] for r in _docs(tmp_path)]
    want = nd.oracle(texts, 5, 14, 8, 0.0, 0)
    assert nd.flagged(tmp_path, "fz", ATTR) == sorted(want)
    assert {11, 6} <= want  # c3 and c2


def _docs(root: Path) -> list[dict]:
    out = []
    for f in sorted((root / "documents").iterdir()):
        raw = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
        out += [orjson.loads(x) for x in raw.splitlines()]
    return out


@pytest.mark.native
@pytest.mark.parametrize("threshold", [0.8, 0.6, 0.0])
def test_generated_corpus_matches_the_brute_force_oracle(tmp_path: Path, threshold: float) -> None:
    docs, _pairs = nd.corpus(11, originals=60, copies=30, words=(30, 120))
    nd.write_tree(tmp_path, docs, files=3, gz=True)
    dedupe(_cfg(tmp_path, threshold=threshold, num_bands=10, band_size=4), engine="inprocess")
    want = nd.oracle([d["text"] for d in docs], 5, 10, 4, threshold, 0)
    got = nd.flagged(tmp_path, "fz", ATTR)
    assert got == sorted(want)
    assert len(got) > 5  # the corpus exercises the check


corpora = st.tuples(st.integers(0, 10_000), st.integers(5, 40), st.integers(0, 20))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    corpora,
    st.sampled_from([None, 300, 1500, 10_000]),  # range size: plain files cut into ranges
    st.sampled_from([1 << 22, 40, 7]),  # bucket entries (parts of buckets)
    st.sampled_from([1 << 21, 16, 3]),  # entries a sign unit holds
    st.sampled_from([1 << 23, 64, 5]),  # hashes per sets object
    st.sampled_from([1 << 24, 200, 1]),  # hashes a verify unit holds
    st.sampled_from([256, 3]),  # documents per kernel call
)
def test_any_unit_size_gives_the_oracles_result_and_the_same_bytes(
    tmp_path_factory, corpus, rb, bucket, spill, chunk, verify, batch
) -> None:
    seed, originals, copies = corpus
    docs, _ = nd.corpus(seed, originals=originals, copies=min(copies, originals), words=(20, 80))
    root = tmp_path_factory.mktemp("c")
    nd.write_tree(root, docs, files=2)
    want = sorted(nd.oracle([d["text"] for d in docs], 5, 6, 3, 0.5, 0))
    dedupe(_cfg(root, "ref", 0.5, num_bands=6, band_size=3), engine="inprocess")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minhash, "BUCKET_ENTRIES", bucket)
        mp.setattr(mu, "SPILL_EVERY", spill)
        mp.setattr(mu, "SET_CHUNK", chunk)
        mp.setattr(mu, "VERIFY_HASHES", verify)
        mp.setattr(mu, "BATCH", batch)
        cfg = _cfg(root, "fz", 0.5, num_bands=6, band_size=3)
        dedupe(cfg, engine="inprocess", range_bytes=rb)
    assert nd.flagged(root, "ref", ATTR) == want
    assert _bytes(root, "fz") == _bytes(root, "ref")


def test_two_worker_processes_write_the_same_bytes(tmp_path: Path) -> None:
    docs, _ = nd.corpus(3, originals=80, copies=40, words=(30, 100))
    nd.write_tree(tmp_path, docs, files=3, gz=True)
    dedupe(_cfg(tmp_path, "one"), engine="inprocess")
    cfg = DedupeConfig.from_dict(
        {
            "documents": [f"{tmp_path}/documents/*"],
            "processes": 2,
            "dedupe": {"name": "two", "minhash": {"attribute_name": ATTR}},
        }
    )
    dedupe(cfg, engine="processes", range_bytes=2000)
    assert _bytes(tmp_path, "one") == _bytes(tmp_path, "two")
    assert nd.flagged(tmp_path, "one", ATTR)


def test_mix_drops_the_flagged_documents(tmp_path: Path) -> None:
    from lmdata.dolma.config import MixerConfig
    from lmdata.dolma.mixer import mix

    docs = _hand_built(tmp_path)
    dedupe(_cfg(tmp_path), engine="inprocess")
    out = tmp_path / "mixed"
    cfg = MixerConfig.from_dict(
        {
            "streams": [
                {
                    "name": "m",
                    "documents": [f"{tmp_path}/documents/*"],
                    "attributes": ["fz"],
                    "filter": {
                        "exclude": [
                            f"$.attributes[?(@.{ATTR} && @.{ATTR}[0] && @.{ATTR}[0][2] >= 1.0)]"
                        ]
                    },
                    "output": {"path": str(out)},
                }
            ]
        }
    )
    mix(cfg)
    kept = []
    for f in sorted(out.iterdir()):
        kept += [orjson.loads(x)["id"] for x in gzip.decompress(f.read_bytes()).splitlines()]
    flagged = {"a-rewrapped", "a-again", "c2", "c3", "short-2", "d-first"}
    assert sorted(kept) == sorted(i for i, _ in docs if i not in flagged)


def test_the_command_line_runs_the_minhash_mode(tmp_path: Path) -> None:
    _hand_built(tmp_path)
    args = ["dedupe", "-d", str(tmp_path / "documents" / "*"), "--dedupe.name", "fz"]
    args += ["--dedupe.minhash.attribute_name", ATTR, "--dedupe.minhash.num_bands", "14"]
    args += ["-q", "--engine", "inprocess"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "6 near-duplicate documents of 15" in r.output
    assert {x["id"] for x in _rows(tmp_path) if x["attributes"]} >= {"c2", "c3"}
    helped = CliRunner().invoke(cli, ["dedupe", "--help"]).output
    assert "--dedupe.minhash.attribute_name" in helped and "jaccard_threshold" in helped


@pytest.mark.parametrize(
    "section, message",
    [
        ({"attribute_name": ATTR, "jaccard_threshold": 1.5}, "jaccard_threshold"),
        ({"attribute_name": ATTR, "ngram_size": 0}, "ngram_size"),
        ({"attribute_name": ATTR, "num_bands": 200, "band_size": 8}, "at most 1024"),
        ({"attribute_name": ATTR, "band_size": "8"}, "without quotes"),
        ({"attribute_name": ATTR, "bands": 3}, "did you mean dedupe.minhash.num_bands"),
        ({"ngram_size": 5}, "attribute_name"),
    ],
)
def test_bad_minhash_settings_are_refused(section: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        DedupeConfig.from_dict({"documents": ["x"], "dedupe": {"minhash": section}})


def test_minhash_takes_no_partitions_or_key_file() -> None:
    mh = {"attribute_name": ATTR}
    for extra in ({"num_partitions": 2}, {"file_partition": True}):
        with pytest.raises(InvalidInputError, match="num_partitions, file_partition"):
            DedupeConfig.from_dict({"documents": ["x"], "dedupe": {"minhash": mh, **extra}})
    with pytest.raises(InvalidInputError, match="exactly one"):
        DedupeConfig.from_dict(
            {"documents": ["x"], "dedupe": {"minhash": mh, "paragraphs": {"attribute_name": "p"}}}
        )


def test_rows_are_orjsons_bytes() -> None:
    name = orjson.dumps('a"b')
    for ident in ("x", 3, None, {"b": 1, "a": [1, 2]}):
        for chars in (None, 0, 17):
            attrs = {} if chars is None else {'a"b': [[0, chars, 1.0]]}
            want = orjson.dumps({"attributes": attrs, "id": ident}, option=orjson.OPT_SORT_KEYS)
            assert mw.row(name, ident, chars) == want + b"\n"


def test_forest_links_every_node_to_its_components_first() -> None:
    import numpy as np

    a = np.array([5, 1, 9, 7, 3], dtype=np.uint64)
    b = np.array([9, 3, 7, 8, 4], dtype=np.uint64)
    node, root = mu.forest(a, b)
    assert dict(zip(node.tolist(), root.tolist(), strict=True)) == {9: 5, 7: 5, 8: 5, 3: 1, 4: 1}
