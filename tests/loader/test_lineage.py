"""Loader.explain(step) and ``lmdata explain``: every row's documents, checked token by token
against the batch the ranks get."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmdata.errors import InvalidInputError
from lmdata.formats._token_view import TokenColumn
from lmdata.loader import Loader
from tests.loader.conftest import Plain, random_seqs, write_flat


def global_batch(loaders: list[Loader], step: int) -> dict[str, np.ndarray]:
    parts = [ld.batch(step) for ld in loaders]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def check(lin, batch: dict, docs: list[list[np.ndarray]], seq_len: int, mode: str) -> None:
    """Each row's segments are its targets, in order; rows with no padding are covered."""
    assert len(lin) == batch["targets"].shape[0]
    for i, row in enumerate(lin):
        at = 0
        for s in row:
            want = docs[s.source][s.document][s.offset : s.offset + s.length]
            assert batch["targets"][i, at : at + s.length].tolist() == want.tolist()
            at += s.length
        if mode in ("packed", "eos") and "loss_mask" not in batch:
            assert at == seq_len
        elif "loss_mask" in batch:
            assert at == int(batch["loss_mask"][i].sum())


@pytest.mark.parametrize("mode", ["packed", "bestfit", "unpacked", "eos"])
@pytest.mark.parametrize("world", [1, 3])
def test_explain_matches_the_tokens_of_every_rank(tmp_path, mode, world):
    a_docs = random_seqs(1, 150, 60)
    b_docs = random_seqs(2, 90, 20)
    a = write_flat(tmp_path / "a.zarr", a_docs, chunk_tokens=64)
    kw = {"seq_len": 16, "global_batch_size": 6, "mode": mode, "weights": [0.5, 0.5]}
    if mode != "eos":
        kw["long_docs"] = "split"
    ranks = [Loader([a, Plain(b_docs)], rank=r, world_size=world, **kw) for r in range(world)]
    for step in (0, 1, 9, 33, 250):
        lin = ranks[0].explain(step)
        assert lin.step == step and all(
            ld.explain(step).row.tolist() == lin.row.tolist() for ld in ranks
        )
        check(lin, global_batch(ranks, step), [a_docs, b_docs], 16, mode)


def test_explain_of_a_finite_pass_lists_no_padding(tmp_path):
    docs = random_seqs(4, 40, 30)
    src = write_flat(tmp_path / "d.zarr", docs)
    loader = Loader(src, seq_len=8, global_batch_size=4, epochs=1, rank=0, world_size=1)
    last = loader.num_steps - 1
    check(loader.explain(last), loader.batch(last), [docs], 8, "packed")
    with pytest.raises(InvalidInputError, match="past the end"):
        loader.explain(loader.num_steps)


def test_document_ids_where_the_dataset_records_them():
    class Records:
        format = "records"

        def __init__(self, docs):
            self.recs = [{"id": f"doc-{i}", "tokens": d} for i, d in enumerate(docs)]

        def __len__(self):
            return len(self.recs)

        def __getitem__(self, i):
            return self.recs[i]

        def take(self, idx):
            return [self.recs[int(i)] for i in idx]

    docs = random_seqs(5, 50, 20)
    view = TokenColumn(Records(docs), "tokens")
    loader = Loader(view, seq_len=8, global_batch_size=4, mode="bestfit", rank=0, world_size=1)
    lin = loader.explain(2)
    for row in lin:
        assert all(s.id == f"doc-{s.document}" for s in row)
    assert loader.explain(2, ids=False)[0][0].id is None
    assert json.loads(json.dumps(lin.to_json()))["rows"][0][0]["id"].startswith("doc-")
