"""lmdata reads what mosaicml-streaming 0.13.0 wrote exactly as StreamingDataset does."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.errors import UnsafeDataError
from lmdata.protocols import Records, TokenSequences
from tests.formats.mds_samples import canonical

DATA = Path(__file__).parent.parent / "data" / "mds"
FIXTURES = {
    "all": "mds",
    "all_zstd": "mds",
    "images": "mds",
    "tokens": "mds",
    "csv": "mds-csv",
    "tsv": "mds-tsv",
    "xsv": "mds-csv",
    "jsonl": "mds-jsonl",
    "merged": "mds",
    "pkl": "mds",
}


def expected(name: str) -> list:
    with open(DATA / f"{name}.expected.pkl", "rb") as f:
        return pickle.load(f)["random"]  # our own fixture, written by the streaming helper


@pytest.fixture
def copy(tmp_path: Path):
    def make(name: str) -> Path:
        shutil.copytree(DATA / name, tmp_path / name)
        return tmp_path / name

    return make


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_detects_format(name: str) -> None:
    assert lmdata.detect(DATA / name) == FIXTURES[name]


@pytest.mark.parametrize("name", sorted(set(FIXTURES) - {"tokens", "pkl"}))
def test_random_access_matches_streaming(name: str) -> None:
    r = lmdata.open(DATA / name)
    assert isinstance(r, Records)
    want = expected(name)
    assert len(r) == len(want)
    order = np.random.default_rng(1).permutation(len(r))
    assert [canonical(r[int(i)]) for i in order] == [want[i] for i in order]
    assert [canonical(x) for x in r.take(order)] == [want[i] for i in order]
    assert [canonical(x) for x in r] == want
    assert canonical(r[-1]) == want[-1]


def test_pkl_is_read_only_when_trusted_and_matches() -> None:
    with pytest.raises(UnsafeDataError, match="allow_unsafe_pickle"):
        lmdata.open(DATA / "pkl")[0]
    r = lmdata.open(DATA / "pkl", allow_unsafe_pickle=True)
    assert [canonical(x) for x in r] == expected("pkl")


def test_tokens_fixture_is_a_token_reader() -> None:
    assert not isinstance(lmdata.open(DATA / "tokens"), TokenSequences)  # records by format
    r = lmdata.open(DATA / "tokens", token_column="tokens")
    assert isinstance(r, TokenSequences)
    want = [w["tokens"] for w in expected("tokens")]
    assert [canonical(a) for a in r] == want
    lengths = [len(a) for a in r]
    assert r.boundaries.tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    flat = np.concatenate(list(r))
    assert r.num_tokens == len(flat)
    assert r.max_token_id == int(flat.max())
    assert np.array_equal(r.span(5, 400), flat[5:400])


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixtures_validate_clean(name: str) -> None:
    trust = {"allow_unsafe_pickle": True} if name == "pkl" else {}
    assert lmdata.validate(DATA / name, **trust) == []


def test_reading_compressed_writes_nothing_beside_it(copy) -> None:
    d = copy("all_zstd")
    before = sorted(p.name for p in d.iterdir())
    r = lmdata.open(d)
    list(r)
    lmdata.validate(d)
    assert sorted(p.name for p in d.iterdir()) == before
