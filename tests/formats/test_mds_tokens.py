"""MDS token datasets as TokenSequences: boundaries, spans, the Loader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import FormatError
from lmdata.protocols import TokenSequences


def write_docs(
    d: Path, docs: list[np.ndarray], columns: dict | None = None, extra: bool = False, **kw
) -> None:
    with lmdata.writer(d, "mds", columns=columns, **kw) as w:
        for i, doc in enumerate(docs):
            w.write({"tokens": doc, "id": i} if extra else doc)


def docs_strategy():
    return st.lists(
        st.lists(st.integers(0, 70_000), min_size=1, max_size=300), min_size=1, max_size=40
    )


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    docs=docs_strategy(),
    data=st.data(),
    enc=st.sampled_from(["ndarray:uint32", "ndarray:int64", "ndarray:uint32:{n}"]),
)
def test_boundaries_and_spans_match_concatenation(tmp_path_factory, docs, data, enc) -> None:
    arrays = [np.array(doc, dtype=np.int64) for doc in docs]
    if enc.endswith("{n}"):
        n = len(docs[0])
        arrays = [np.resize(a, n) for a in arrays]
        enc = enc.format(n=n)
    d = tmp_path_factory.mktemp("tok") / "d"
    write_docs(
        d, arrays, columns={"tokens": enc}, size_limit=data.draw(st.sampled_from([None, 300, 2000]))
    )
    records = lmdata.open(d)  # the kind comes from the format: records, as streaming returns
    assert not isinstance(records, TokenSequences)
    assert records[0]["tokens"].tolist() == arrays[0].tolist()
    r = lmdata.open(d, token_column="tokens")
    assert isinstance(r, TokenSequences)
    flat = np.concatenate(arrays)
    assert r.num_tokens == len(flat)
    assert r.boundaries.dtype == np.uint64
    assert r.boundaries.tolist() == [0, *np.cumsum([len(a) for a in arrays]).tolist()]
    assert r.max_token_id == int(flat.max())
    a = data.draw(st.integers(0, len(flat)))
    b = data.draw(st.integers(a, len(flat)))
    assert r.span(a, b).tolist() == flat[a:b].tolist()
    i = data.draw(st.integers(0, len(arrays) - 1))
    assert r[i].tolist() == arrays[i].tolist()


def test_dynamic_dtype_column_needs_the_option_and_works(tmp_path: Path) -> None:
    docs = [np.arange(5, dtype=np.uint16), np.arange(300, dtype=np.int32), np.ones(2, np.uint8)]
    write_docs(
        tmp_path / "d", docs, columns={"tokens": "ndarray", "id": "int"}, extra=True, size_limit=700
    )
    assert not isinstance(lmdata.open(tmp_path / "d"), TokenSequences)
    r = lmdata.open(tmp_path / "d", token_column="tokens")
    assert isinstance(r, TokenSequences)
    assert r.boundaries.tolist() == [0, 5, 305, 307]
    assert r.span(3, 8).tolist() == [3, 4, 0, 1, 2]
    assert [len(x) for x in r.take([2, 0])] == [2, 5]


def test_non_token_columns_are_refused(tmp_path: Path) -> None:
    write_docs(tmp_path / "d", [np.ones(3, np.float32)], columns={"tokens": "ndarray:float32"})
    assert not isinstance(lmdata.open(tmp_path / "d"), TokenSequences)
    with pytest.raises(FormatError, match="integer"):
        lmdata.open(tmp_path / "d", token_column="tokens")
    with pytest.raises(FormatError, match="no column"):
        lmdata.open(tmp_path / "d", token_column="ids")


def test_a_float_array_in_a_dynamic_column_is_an_error_when_read(tmp_path: Path) -> None:
    write_docs(
        tmp_path / "d",
        [np.ones(3, np.int32), np.ones(3, np.float32)],
        columns={"tokens": "ndarray"},
    )
    r = lmdata.open(tmp_path / "d", token_column="tokens")
    assert r[0].tolist() == [1, 1, 1]
    with pytest.raises(lmdata.LmdataError):
        r[1]
    with pytest.raises(lmdata.LmdataError):
        r.boundaries  # noqa: B018


def test_loader_trains_on_an_mds_token_dataset(tmp_path: Path) -> None:
    docs = [np.arange(1, 40 + i, dtype=np.uint32) for i in range(20)]
    write_docs(tmp_path / "d", docs, size_limit="2kb")
    from lmdata.loader import Loader

    loader = Loader(
        lmdata.open(tmp_path / "d", token_column="tokens"), seq_len=16, batch_size=4, shuffle=False
    )
    batch = loader.batch(0)
    flat = np.concatenate(docs)
    assert batch["targets"].tolist() == flat[:64].reshape(4, 16).tolist()
