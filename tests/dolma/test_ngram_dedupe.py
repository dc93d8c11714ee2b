"""Paragraph n-gram dedupe (``by_ngram``): dolma 1.2.1's attribute files byte for byte on a
generated corpus (a committed fixture, and live when the side venv has dolma), the same for any
number of workers, and the rules one by one with hand-computed scores."""

from __future__ import annotations

import gzip
import logging
import shutil
from pathlib import Path

import pytest

from lmdata.dolma import dedupe as dd
from lmdata.dolma import ngrams
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.ngrams import Ngrams
from lmdata.errors import InvalidInputError
from tests.dolma import ngram_oracle as oracle

FIXTURE = oracle.FIXTURE
PARTS = ("part-0.jsonl.gz", "part-1.jsonl.gz")


def _raw(p: Path) -> bytes:
    return gzip.decompress(p.read_bytes())


def _run(root: Path, name: str, by_ngram: dict, extra: dict, **kw: object) -> None:
    cfg = DedupeConfig.from_dict({**oracle.lmdata_config(root, name, by_ngram, extra), **kw})
    dd.dedupe(cfg, engine="inprocess" if cfg.processes == 1 else "processes")


@pytest.mark.parametrize(
    "name, by_ngram, extra", oracle.CONFIGS, ids=[c[0] for c in oracle.CONFIGS]
)
def test_fixture_written_by_dolma_is_reproduced(tmp_path, name, by_ngram, extra):
    root = tmp_path / "ds"
    shutil.copytree(FIXTURE / "documents", root / "documents")
    _run(root, name, by_ngram, extra)
    for part in PARTS:
        want = _raw(FIXTURE / "attributes" / name / part)
        assert _raw(root / "attributes" / name / part) == want, part
    assert b"0." in _raw(FIXTURE / "attributes" / "n2s2" / PARTS[0])  # fractions are exercised


def test_any_worker_and_bucket_count_gives_the_same_bytes(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    shutil.copytree(FIXTURE / "documents", root / "documents")
    name, by_ngram, extra = oracle.CONFIGS[0]
    _run(root, name, by_ngram, extra, processes=2)
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 20)  # many buckets, split in parts
    monkeypatch.setattr(dd, "SPILL_EVERY", 5)
    _run(root, "again", by_ngram, extra)
    for part in PARTS:
        want = _raw(FIXTURE / "attributes" / name / part)
        assert _raw(root / "attributes" / name / part) == want
        assert _raw(root / "attributes" / "again" / part) == want


@pytest.mark.skipif(not oracle.DOLMA_PYTHON.exists(), reason="no .venv/bench-dolma (dolma 1.2.1)")
@pytest.mark.parametrize("seed", [7, 8])
def test_live_against_dolma_on_fresh_corpora(tmp_path, seed):
    root = tmp_path / "ds"
    oracle.write_tree(root, oracle.corpus(seed, files=3, docs=20))
    theirs = tmp_path / "theirs"
    shutil.copytree(root, theirs)
    oracle.run_dolma(theirs, tmp_path / "work")
    for name, by_ngram, extra in oracle.CONFIGS:
        _run(root, name, by_ngram, extra)
        for k in range(3):
            part = f"part-{k}.jsonl.gz"
            assert _raw(root / "attributes" / name / part) == _raw(
                theirs / "attributes" / name / part
            ), (seed, name, part)


def test_tokens_are_word_bounds_without_whitespace() -> None:
    assert ngrams.tokens("Hello,  world!\tdon't 3.14") == [
        "Hello",
        ",",
        "world",
        "!",
        "don't",
        "3.14",
    ]
    assert ngrams.tokens("日本語のテキスト\u3000です") == [
        "日",
        "本",
        "語",
        "の",
        "テキスト",
        "で",
        "す",
    ]


def test_strided_windows_include_the_second_one() -> None:
    """dolma checks a window when the last checked start is 0 or ``stride`` behind: with
    stride 2 over 8 tokens the 2-grams starting at 0, 1, 3 and 5 are checked."""
    ks, fallback = ngrams.keys("a b c d e f g h", Ngrams(length=2, stride=2))
    assert not fallback
    assert [k.split("\0")[1:] for k in ks] == [["a", "b"], ["b", "c"], ["d", "e"], ["f", "g"]]
    assert len(ngrams.keys("a b c d e f g h", Ngrams(length=2, stride=1))[0]) == 7


def test_short_paragraphs_fall_back_to_the_whole_text() -> None:
    ng = Ngrams(length=3)
    assert ngrams.keys("p q", ng) == (["1\0p q"], True)
    one, fallback = ngrams.keys("k l m", ng)  # one window, then the whole paragraph
    assert fallback and one == ["3\0k\0l\0m", "1\0k l m"]
    assert ngrams.keys("p q", Ngrams(length=3, skip_short=True)) == ([], False)
    # with 1-grams the fallback key is the window itself: a one-word paragraph flags itself
    ks, fallback = ngrams.keys("foo", Ngrams(length=1))
    assert fallback and ks == ["1\0foo", "1\0foo"]


def test_scores_are_float32_fractions_against_a_float32_threshold() -> None:
    ng = Ngrams(length=1, threshold=0.5)
    assert ngrams.score("z z z", ng, {1, 2}) == 0.6666666865348816
    assert ngrams.score("a b c", ng, {2}) is None  # 1/3 < 0.5
    # 7/10 in float32 equals 0.7 in float32 (in float64 it would be just below 0.7)
    ten = " ".join("abcdefghij")
    assert ngrams.score(ten, Ngrams(length=1, threshold=0.7), set(range(7))) == pytest.approx(0.7)
    assert ngrams.score("k l m", Ngrams(length=3), {1}) == 1.0  # fell back, whole text seen
    assert ngrams.score("k l m", Ngrams(length=3), {0}) is None
    assert ngrams.score("p", Ngrams(length=3, skip_short=True, threshold=0.0), set()) is None


def test_hand_computed_attribute_rows(tmp_path) -> None:
    """Within a paragraph repeats count too (dolma checks, then inserts, every window);
    punctuation is a token of its own."""
    texts = ["a b c d e", "a b c d e", "a b c x y", "z z z z z", "Hello, world foo", "world foo"]
    oracle.write_tree(tmp_path / "ds", [texts])
    _run(tmp_path / "ds", "x", {"ngram_length": 2, "overlap_threshold": 0.5}, {})
    rows = _raw(tmp_path / "ds" / "attributes" / "x" / PARTS[0]).decode().splitlines()
    assert rows == [
        '{"attributes":{"dup":[]},"id":"0-0"}',
        '{"attributes":{"dup":[[0,9,1.0]]},"id":"0-1"}',
        '{"attributes":{"dup":[[0,9,0.5]]},"id":"0-2"}',  # ab bc dup, cx xy new
        '{"attributes":{"dup":[[0,9,0.75]]},"id":"0-3"}',  # zz once new, then 3 repeats
        '{"attributes":{"dup":[]},"id":"0-4"}',
        # its one window was seen, but with fewer than 2 windows the whole text decides
        '{"attributes":{"dup":[]},"id":"0-5"}',
    ]


def test_by_ngram_config_is_checked_and_bloom_settings_are_stated(tmp_path, caplog) -> None:
    base = {"documents": ["x/documents/*.gz"], "dedupe": {"name": "n"}}

    def cfg(by_ngram: object, **top: object) -> DedupeConfig:
        para = {"attribute_name": "p", "by_ngram": by_ngram}
        return DedupeConfig.from_dict({**base, **top, "dedupe": {"name": "n", "paragraphs": para}})

    assert cfg(None).ngrams == Ngrams()
    assert cfg({"ngram_length": 5}).ngrams == Ngrams(length=5, threshold=1.0)
    with pytest.raises(InvalidInputError, match=r"by_ngram\.ngram_length must be an integer"):
        cfg({"ngram_length": "5"})
    with pytest.raises(InvalidInputError, match="without quotes"):
        cfg({"ngram_length": "5"})
    with pytest.raises(InvalidInputError, match=r"overlap_threshold must be a number in 0\.\.1"):
        cfg({"ngram_length": 5, "overlap_threshold": 2})
    with pytest.raises(
        InvalidInputError, match=r"unknown key dedupe\.paragraphs\.by_ngram\.length"
    ):
        cfg({"length": 5})
    with pytest.raises(InvalidInputError, match=r"bloom_filter\.estimated_doc_count"):
        cfg(None, bloom_filter={"estimated_doc_count": "1000"})
    bloom = {"file": str(tmp_path / "bf.bin"), "read_only": False, "estimated_doc_count": 1000}
    got = cfg(None, bloom_filter=bloom).bloom_filter
    assert (got.file, got.read_only, got.given) == (bloom["file"], False, ("estimated_doc_count",))
    oracle.write_tree(tmp_path / "ds", [["a b", "a b"]])
    with caplog.at_level(logging.WARNING, logger="lmdata.dolma.dedupe"):
        dd.dedupe(
            DedupeConfig.from_dict(
                {
                    "documents": [str(tmp_path / "ds")],
                    "dedupe": {"name": "n", "paragraphs": {"attribute_name": "p"}},
                    "bloom_filter": bloom,
                }
            ),
            engine="inprocess",
        )
    assert "sizing settings accepted and not used: estimated_doc_count" in caplog.text
    assert "lmdata keeps exact keys, not a Bloom filter" in caplog.text
    assert (tmp_path / "bf.bin").read_bytes()[:8] == b"LMDKEYS1"  # the run's keys


@pytest.mark.parametrize(
    "key, value", [("num_partitions", "2"), ("num_partitions", "two"), ("min_length", "3")]
)
def test_quoted_integers_are_refused_naming_the_key(key, value) -> None:
    d = {"documents": ["x/documents/*.gz"], "dedupe": {"paragraphs": {"attribute_name": "p"}}}
    d["dedupe"][key] = value
    with pytest.raises(InvalidInputError, match=rf"dedupe\.{key} must be an integer") as e:
        DedupeConfig.from_dict(d)
    assert ("without quotes" in str(e.value)) == value.isdigit()
    d["dedupe"][key] = None if key == "num_partitions" else 0
    DedupeConfig.from_dict(d)  # null num_partitions is dolma's default (1)
