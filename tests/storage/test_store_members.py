"""Every store honours the members format code uses instead of reaching around the protocol:
local paths, identities, create-only puts, batched reads, tree copies, usage, refreshed
listings, and outputs built locally (uploaded at commit) or staged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmdata.storage import Store, join, shown


def _tree(store: Store, key: str, files: dict[str, bytes]) -> None:
    out = store.output(key, directory=True, overwrite=False)
    for name, data in files.items():
        out.write(name, data)
    out.commit()


FILES = {"a.bin": bytes(range(256)) * 4, "sub/b.bin": b"xyz", "sub/deeper/c": b""}


def test_local_path_and_shown_name_a_local_file_only(store_root):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, {"a": b"1"})
    local = store.local_path(join(key, "a"))
    if store.id == "file":
        assert local == join(key, "a") and Path(local).read_bytes() == b"1"
        assert shown(store, join(key, "a")) == Path(key, "a")
    else:
        assert local is None
        assert shown(store, join(key, "a")) == store.url(join(key, "a"))


def test_identity_changes_with_the_bytes(store_root):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, {"a": b"one", "b": b"one"})
    first = store.identity(join(key, "a"))
    assert store.identity(join(key, "a")) == first  # stable while nothing changes
    store.put(join(key, "a"), b"two!")
    again = store.identity(join(key, "a"))
    if store.id == "memory":  # memory:// has no versions: callers then hash the bytes
        assert first is None and again is None
    else:
        assert isinstance(first, bytes) and isinstance(again, bytes) and again != first


def test_put_replaces_whole_and_create_refuses_an_existing_object(store_root):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, {"a": b"old"})
    store.put(join(key, "a"), b"new")
    assert store.read(join(key, "a")) == b"new"
    with pytest.raises(FileExistsError):
        store.put(join(key, "a"), b"other", create=True)
    assert store.read(join(key, "a")) == b"new"
    store.put(join(key, "fresh"), memoryview(b"made"), create=True)
    assert store.read(join(key, "fresh")) == b"made"
    assert sorted(store.list(key)) == ["a", "fresh"]  # no temporary left beside them
    if store.local_path(key) is not None:  # a folder this machine cannot see is an error
        with pytest.raises(FileNotFoundError):
            store.put(join(key, "nofolder", "x"), b"")


def test_read_many_reads_ranges_of_several_objects(store_root):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, FILES)
    a, b = join(key, "a.bin"), join(key, "sub/b.bin")
    got = store.read_many([(a, 10, 5), (b, 0, None), (a, 1000, 100), (a, 0, None), (b, 1, 1)])
    data = FILES["a.bin"]
    assert got == [data[10:15], b"xyz", data[1000:], data, b"y"]
    assert store.read_many([]) == []
    with pytest.raises(FileNotFoundError):
        store.read_many([(join(key, "nope"), 0, None)])


def test_copy_tree_copies_folders_and_objects(store_root):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, FILES)
    store.copy_tree(key, join(root, "copy"))
    store.copy_tree(join(key, "sub/b.bin"), join(root, "one.bin"))
    for name, data in FILES.items():
        if data:  # (object stores keep no empty folders; an empty object is kept)
            assert store.read(join(root, "copy", name)) == data
    assert store.read(join(root, "one.bin")) == b"xyz"
    assert store.read(join(key, "a.bin")) == FILES["a.bin"]  # the source stays


def test_get_tree_fetches_a_folder_to_local_disk(store_root, tmp_path):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, {**FILES, ".lmdata-writing-x": b"claim"})
    dest = tmp_path / "got"
    store.get_tree(key, str(dest))
    found = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert found == FILES  # lmdata's own objects left out
    if store.local_path(key) is not None:  # hard links, not copies
        assert os.stat(dest / "a.bin").st_ino == os.stat(join(key, "a.bin")).st_ino


def test_versions_list_sizes_and_change_with_the_bytes(store_root):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, FILES)
    found = store.versions(key)
    assert sorted((k.rsplit("/", 1)[-1], n) for k, (n, _) in found.items()) == sorted(
        (name.rsplit("/", 1)[-1], len(data)) for name, data in FILES.items()
    )
    top = store.versions(key, recursive=False)
    assert [k.rsplit("/", 1)[-1] for k in top] == ["a.bin"]
    (one,) = store.versions(join(key, "a.bin")).values()
    assert one == top[next(iter(top))]
    before = dict(found)
    store.put(join(key, "sub/b.bin"), b"xyzw")
    after = store.versions(key)
    changed = [k for k in after if after[k] != before.get(k)]
    assert [k.rsplit("/", 1)[-1] for k in changed] == ["b.bin"]


def test_usage_counts_the_bytes_below_a_key(store_root):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, FILES)
    u = store.usage(key)
    assert u.apparent == sum(map(len, FILES.values()))
    assert u.disk >= 0 and store.usage(join(key, "sub/b.bin")).apparent == 3


def test_refresh_sees_objects_another_writer_made(store_root, request):
    store, root = store_root
    key = join(root, "ds")
    _tree(store, key, {"a": b"1"})
    assert store.list(key) == ["a"]
    if store.id == "s3":  # another process's client: this store's listing cache misses it
        import fsspec

        other = fsspec.filesystem(
            "s3", skip_instance_cache=True, **request.getfixturevalue("s3_server")
        )
        other.pipe_file(join(key, "b"), b"2")
    elif store.id == "memory":
        store.put(join(key, "b"), b"2")
    else:
        Path(key, "b").write_bytes(b"2")
    store.refresh(key)
    assert store.list(key) == ["a", "b"]


@pytest.mark.parametrize("directory", [True, False])
def test_a_local_output_is_built_on_disk_and_appears_whole_at_commit(store_root, directory):
    store, root = store_root
    key = join(root, "ds" if directory else "one.bin")
    out = store.output(key, directory=directory, overwrite=False, local=True)
    assert out.tmp is not None and os.path.exists(os.path.dirname(out.tmp))
    if directory:
        Path(out.tmp, "data").mkdir()
        Path(out.tmp, "data", "0").write_bytes(b"payload")  # written by path, seekable
        out.write_last("meta.json", b"{}")
    else:
        with open(out.tmp, "w+b") as f:
            f.write(b"header..body")
            f.seek(0)
            f.write(b"HEADER")
    assert not store.exists(key)  # nothing at the destination before commit
    out.commit()
    assert out.done
    if directory:
        assert store.read(join(key, "data/0")) == b"payload"
        assert store.read(join(key, "meta.json")) == b"{}"
    else:
        assert store.read(key) == b"HEADER..body"
    assert not os.path.exists(out.tmp)  # the local build is gone (moved or uploaded)


def test_a_local_output_uploads_the_last_objects_last(store_root, monkeypatch):
    store, root = store_root
    key = join(root, "ds")
    out = store.output(key, directory=True, overwrite=False, local=True)
    if store.local_path(key) is not None:
        pytest.skip("a local output is renamed into place whole: there is no order to see")
    order = []
    real = out.inner.open_write
    monkeypatch.setattr(out.inner, "open_write", lambda n: order.append(n) or real(n))
    real_last = out.inner.write_last
    monkeypatch.setattr(
        out.inner, "write_last", lambda n, d: order.append(f"last:{n}") or real_last(n, d)
    )
    out.write_last("meta.json", b"{}")
    out.write("z", b"data")
    out.write_last("manifest", b"m")
    out.commit()
    assert order == ["z", "last:meta.json", "last:manifest"]


def test_an_aborted_local_output_leaves_nothing(store_root):
    store, root = store_root
    key = join(root, "ds")
    out = store.output(key, directory=True, overwrite=False, local=True)
    out.write("a", b"x")
    tmp = out.tmp
    out.abort()
    assert not store.exists(key) and tmp is not None and not os.path.exists(tmp)


def test_a_staged_output_appears_at_commit_without_its_marker(store_root):
    store, root = store_root
    key = join(root, "tree")
    _tree(store, key, {"documents/old.gz": b"old"})
    out = store.output(
        key, directory=True, overwrite=True, staged=True, marker="documents/.lmdata-committing"
    )
    out.write("documents/new.gz", b"new")
    assert store.read(join(key, "documents/old.gz")) == b"old"  # the old tree until commit
    out.commit()
    assert store.list(join(key, "documents")) == ["new.gz"]
    assert [n for n in store.list(root) if n.startswith(".lmdata")] == []
