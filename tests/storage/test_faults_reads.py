"""Readers whose objects are replaced or damaged under them (moto's S3 server on 127.0.0.1,
memory://, local disk): every record read is the one the reader opened, or the read raises a
DatasetChangedError naming the object, never bytes of two versions mixed; the pins that check
it cost no request per read and travel into DataLoader workers."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np
import pytest

import lmdata
from lmdata.errors import DatasetChangedError
from lmdata.storage import resolve
from lmdata.storage.manifest import is_manifest_name

FORMATS = {
    "flat-tokens": {"chunk_tokens": 256},
    "mds": {"size_limit": 1500},
    "atlas": {"shard_size": 40},
    "modalities": {"vocab_size": 1000},
    "modalities-jsonl": {},
    "jsonl": {},
    "dolma": {"max_file_docs": 40},
}
TOKENS = ("flat-tokens", "modalities")
N = 120


def _records(fmt: str, seed: int) -> list:
    out = []
    for i in range(N):
        n = (i * seed) % 13 + 3
        if fmt in TOKENS:
            out.append(np.arange(n, dtype=np.int64) + seed)
        else:
            out.append({"id": str(i), "text": f"v{seed} " + "x" * n})
    return out


def _write(url: str, fmt: str, seed: int, overwrite: bool = False) -> list:
    recs = _records(fmt, seed)
    with lmdata.writer(url, fmt, overwrite=overwrite, **FORMATS[fmt]) as w:
        for r in recs:
            w.write(r)
    return [_plain(r) for r in recs]


def _plain(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, dict):
        return {k: v for k, v in x.items() if k in ("id", "text")}
    return x


def _data_object(url: str) -> tuple[object, str]:
    """(raw fsspec filesystem, key) of the largest object of the dataset at ``url``: a data
    object (chunk, shard, data file), never only metadata."""
    store, key = resolve(url)
    found = {
        k: v
        for k, v in store.fs.find(key, detail=True).items()
        if not is_manifest_name(k.rsplit("/", 1)[-1])
    }
    # (flat-tokens: a chunk of tokens; its padded seq_starts chunk is larger, read at open;
    # never the manifest, which a small dataset's data objects may be smaller than)
    name = max(found, key=lambda k: ("seq_starts" not in k, found[k]["size"], k))
    return store.fs, name


def _replace(url: str, fmt: str, how: str) -> None:
    """Replace what the reader at ``url`` opened: by lmdata's overwrite (other lengths), or
    one data object by a raw put with other bytes of the same size, or of another size."""
    if how == "overwrite":
        _write(url, fmt, 7, overwrite=True)
        return
    fs, key = _data_object(url)
    data = bytes(fs.cat_file(key))
    other = bytes(b ^ 0x21 for b in data)
    if how == "other-size":
        other += other[: len(other) // 2]
    fs.pipe_file(key, other)


def _read_all(r, want: list) -> tuple[int, list[DatasetChangedError]]:
    """Read every record; count those equal to the opened version, collect the refusals."""
    same, refused = 0, []
    for i in range(len(want)):
        try:
            got = _plain(r[i])
        except DatasetChangedError as e:
            refused.append(e)
            continue
        assert got == want[i], f"record {i} is of neither the opened version nor refused"
        same += 1
    return same, refused


# every way of replacing on S3; memory:// (whose pins are the objects' identity) by overwrite
CASES = [("s3", how) for how in ("overwrite", "same-size", "other-size")] + [
    ("memory", "overwrite")
]


@pytest.mark.parametrize(("where", "how"), CASES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_an_object_replaced_under_a_reader_is_refused_or_read_as_opened(
    request, memory_root, fmt, where, how
):
    root = request.getfixturevalue("s3_root") if where == "s3" else memory_root
    url = f"{root}/{fmt}"
    want = _write(url, fmt, 1)
    r = lmdata.open(url, format=fmt)
    assert _plain(r[0]) == want[0]  # the first objects read already, the others not yet
    _replace(url, fmt, how)
    same, refused = _read_all(r, want)
    assert same + len(refused) == N
    scheme = root.split("://")[0]
    for e in refused:  # each names the object, as a URL
        assert e.path and e.path.startswith(f"{scheme}://") and "since this reader opened" in str(e)
    # what was read before is read the same again (from the cache, or refused)
    again = _read_all(r, want)
    assert again[0] + len(again[1]) == N


@pytest.mark.parametrize("damage", ["truncate", "empty", "delete"])
@pytest.mark.parametrize("fmt", ["mds", "atlas", "modalities", "flat-tokens"])
def test_an_object_damaged_under_a_reader_is_refused(s3_root, fmt, damage):
    url = f"{s3_root}/{fmt}"
    want = _write(url, fmt, 1)
    r = lmdata.open(url, format=fmt)
    fs, key = _data_object(url)
    if damage == "delete":
        fs.rm(key)
    else:
        data = bytes(fs.cat_file(key))
        fs.pipe_file(key, data[: len(data) // 3] if damage == "truncate" else b"")
    same, refused = _read_all(r, want)
    assert refused, "no read noticed the damaged object"
    assert all(e.path == f"s3://{key}" for e in refused)
    assert same + len(refused) == N


@pytest.fixture
def s3_calls(monkeypatch, s3_server):
    """Every S3 request of this process with its arguments, as (method, kwargs)."""
    s3fs = pytest.importorskip("s3fs")
    log: list[tuple[str, dict]] = []
    orig = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *a, **kw):
        log.append((method, dict(kw)))
        return await orig(self, method, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return log


@pytest.mark.parametrize("fmt", ["mds", "flat-tokens", "modalities", "atlas"])
def test_pinning_costs_no_request_per_read(s3_root, s3_calls, fmt):
    """The version comes from the listing or HEAD the reader makes at open: each read is one
    ranged GET carrying If-Match with that ETag, no HEAD and no listing per read."""
    url = f"{s3_root}/{fmt}"
    _write(url, fmt, 1)
    r = lmdata.open(url, format=fmt)
    s3_calls.clear()
    for i in (3, 50, 97, 119):
        r[i]
    assert s3_calls, "the reads sent no request"
    assert {m for m, _ in s3_calls} == {"get_object"}
    for _, kw in s3_calls:
        assert kw.get("IfMatch", "").startswith('"') and kw.get("Range", "").startswith("bytes=")


def test_a_pickled_reader_reads_what_its_parent_opened(s3_root):
    url = f"{s3_root}/mds"
    want = _write(url, "mds", 1)
    r = lmdata.open(url)
    blob = pickle.dumps(r)
    _write(url, "mds", 7, overwrite=True)
    child = pickle.loads(blob)  # as a DataLoader worker gets it
    with pytest.raises(DatasetChangedError, match="replaced"):
        [child[i] for i in range(N)]
    assert _plain(lmdata.open(url)[5]) == _plain(_records("mds", 7)[5])  # a new open: new data
    assert want[5] != _plain(_records("mds", 7)[5])


class _Texts:
    def __init__(self, reader):
        self.reader = reader

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, i):
        return self.reader[i]["text"]


def test_a_spawned_dataloader_worker_never_reads_a_newer_dataset(s3_root):
    torch = pytest.importorskip("torch")
    if "spawn" not in mp.get_all_start_methods():
        pytest.skip("no spawn here")
    url = f"{s3_root}/mds-dl"
    _write(url, "mds", 1)
    reader = lmdata.open(url)
    _write(url, "mds", 7, overwrite=True)
    dl = torch.utils.data.DataLoader(
        _Texts(reader), batch_size=8, num_workers=1, multiprocessing_context="spawn", timeout=120
    )
    with pytest.raises(DatasetChangedError):
        list(dl)


def test_the_range_cache_never_joins_bytes_of_two_versions(s3_root):
    """A store's cached ranges are of the version it pinned: a read overlapping them after
    the object changed is refused, not put together from old and new bytes; a store that
    writes the object reads what it wrote."""
    store, key = resolve(f"{s3_root}/blob")
    old = bytes(range(256)) * 40
    store.put(key, old)
    assert store.read_range(key, 0, 1000) == old[:1000]  # cached
    writer, _ = resolve(f"{s3_root}/blob")
    new = bytes(255 - b for b in old)
    writer.put(key, new)
    assert store.read_range(key, 100, 500) == old[100:600]  # the cached version, whole
    with pytest.raises(DatasetChangedError):
        store.read_range(key, 500, 1000)  # half cached, half not: never a mix
    assert resolve(f"{s3_root}/blob")[0].read_range(key, 500, 1000) == new[500:1500]
    store.put(key, old)  # the store's own write drops its pins and cached ranges
    assert store.read_range(key, 500, 1000) == old[500:1500]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_local_dataset_replaced_under_a_reader_is_refused_or_read_as_opened(tmp_path, fmt):
    """Locally a writer swaps the new dataset in by a rename: files the reader opens after
    that belong to the new dataset, which the reader refuses to mix with what it opened."""
    url = str(tmp_path / fmt)
    want = _write(url, fmt, 1)
    r = lmdata.open(url, format=fmt)
    assert _plain(r[0]) == want[0]
    _write(url, fmt, 7, overwrite=True)
    same, refused = _read_all(r, want)
    assert same + len(refused) == N
    blob = pickle.dumps(r)  # a worker opens its files anew: never the new dataset's
    try:
        child = pickle.loads(blob)  # (flat-tokens reads its metadata again here)
    except DatasetChangedError:
        return
    same, refused = _read_all(child, want)
    assert refused and same + len(refused) == N
