"""A torch DataLoader with 2 workers (fork and spawn) reads an MDS dataset on S3 (moto):
the reader made in the parent is pickled or forked into the workers, each making its own
filesystem and event loop."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import lmdata


class _Texts:
    def __init__(self, reader):
        self.reader = reader

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, i):
        return self.reader[i]["text"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_two_workers_on_s3(s3_root, method):
    torch = pytest.importorskip("torch")
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} here")
    url = f"{s3_root}/dl-{method}"
    texts = [f"record {i} " * (i % 4 + 1) for i in range(64)]
    with lmdata.writer(url, "mds", size_limit=300) as w:
        for i, t in enumerate(texts):
            w.write({"id": i, "text": t})
    reader = lmdata.open(url)
    assert reader[0]["text"] == texts[0]  # the parent's filesystem and event loop exist now
    dl = torch.utils.data.DataLoader(
        _Texts(reader),
        batch_size=8,
        num_workers=2,
        multiprocessing_context=method,
        collate_fn=list,
        timeout=120,
    )
    got = [t for batch in dl for t in batch]
    assert got == texts
