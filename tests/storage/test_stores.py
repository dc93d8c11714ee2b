"""Both stores honour the Store protocol the same way: reads, listing, outputs, commits."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.errors import OutputExistsError
from lmdata.storage import Output, Store, join
from lmdata.storage.base import merge_ranges


def _commit(store, key, files, last=()):
    out = store.output(key, directory=True, overwrite=False)
    for name, data in files.items():
        out.write(name, data)
    for name, data in last:
        out.write_last(name, data)
    out.commit()
    return out


def test_both_stores_match_the_protocol(store_root):
    store, root = store_root
    assert isinstance(store, Store)
    out = store.output(join(root, "x"), directory=True, overwrite=False)
    assert isinstance(out, Output)
    out.abort()


def test_reads_sizes_and_listing(store_root):
    store, root = store_root
    data = bytes(range(256)) * 40
    _commit(store, join(root, "ds"), {"a.bin": data, "sub/b.bin": b"xyz"})
    ds = join(root, "ds")
    assert store.exists(join(ds, "a.bin")) and not store.exists(join(ds, "nope"))
    assert store.is_dir(ds) and store.is_dir(join(ds, "sub"))
    assert not store.is_dir(join(ds, "a.bin"))
    assert store.list(ds) == ["a.bin", "sub"]
    assert store.list(join(ds, "a.bin")) == [] and store.list(join(ds, "nope")) == []
    assert store.size(join(ds, "a.bin")) == len(data)
    assert store.read_range(join(ds, "a.bin"), 250, 10) == data[250:260]
    assert store.read_range(join(ds, "a.bin"), len(data) - 3, 10) == data[-3:]
    assert store.read(join(ds, "sub/b.bin")) == b"xyz"
    with pytest.raises(FileNotFoundError):
        store.size(join(ds, "nope"))
    with pytest.raises(FileNotFoundError):
        store.read_range(join(ds, "nope"), 0, 1)


def test_mmap_is_zero_copy_locally_and_absent_remotely(store_root):
    store, root = store_root
    _commit(store, join(root, "ds"), {"a.bin": b"hello"})
    view = store.mmap(join(root, "ds", "a.bin"))
    if store.can_mmap:
        assert bytes(view) == b"hello"
    else:
        assert view is None


@settings(max_examples=30, deadline=None)
@given(
    ranges=st.lists(
        st.tuples(st.integers(0, 300_000), st.integers(0, 100_000)), min_size=0, max_size=12
    )
)
def test_read_ranges_equals_single_reads(ranges):
    from lmdata.storage import FsspecStore

    store = FsspecStore("memory")
    key = "/lmdata-test-ranges/blob"
    if not store.exists(key):
        store.put(key, bytes(i % 251 for i in range(400_000)))
    got = store.read_ranges(key, ranges)
    assert got == [store.read_range(key, s, n) for s, n in ranges]


def test_merge_ranges_groups_close_ranges_and_keeps_every_member():
    groups = merge_ranges([(100, 10), (0, 10), (15, 5), (10_000, 1)], max_gap=10)
    assert groups == [(0, 20, [1, 2]), (100, 10, [0]), (10_000, 1, [3])]


def test_metadata_last_nothing_valid_before_commit(store_root):
    store, root = store_root
    ds = join(root, "ds")
    out = store.output(ds, directory=True, overwrite=False)
    out.write("data/0", b"payload")
    out.write_last("meta.json", b"{}")
    # the validating object is nowhere a reader looks before commit
    assert not store.exists(join(ds, "meta.json"))
    out.commit()
    assert store.read(join(ds, "meta.json")) == b"{}"
    assert store.read(join(ds, "data/0")) == b"payload"
    assert out.done


def test_abort_removes_everything(store_root):
    store, root = store_root
    ds = join(root, "ds")
    out = store.output(ds, directory=True, overwrite=False)
    with out.open_write("big") as f:
        f.write(b"x" * 1000)
    out.write_last("meta.json", b"{}")
    out.abort()
    assert not store.exists(ds)
    assert [n for n in store.list(root) if "ds" in n] == []


def test_overwrite_is_refused_unless_asked(store_root):
    store, root = store_root
    ds = join(root, "ds")
    _commit(store, ds, {"a": b"one"})
    with pytest.raises(OutputExistsError):
        store.output(ds, directory=True, overwrite=False)
    out = store.output(ds, directory=True, overwrite=True)
    out.write("b", b"two")
    out.commit()
    assert store.list(ds) == ["b"]


def test_single_object_output(store_root):
    store, root = store_root
    key = join(root, "one.bin")
    out = store.output(key, directory=False, overwrite=False)
    out.write_last("", b"all of it")
    out.commit()
    assert store.read(key) == b"all of it"


def test_stores_pickle_without_open_files(store_root):
    store, root = store_root
    _commit(store, join(root, "ds"), {"a": b"abc"})
    store.read_range(join(root, "ds", "a"), 0, 1)  # opens a file / a filesystem
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read_range(join(root, "ds", "a"), 1, 2) == b"bc"
    assert "secret" not in repr(copy)
