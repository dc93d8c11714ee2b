"""Writers of every format stopped on S3 (the loopback moto server) right after each of their
mutating requests: what a reader accepts is then the complete old dataset, the complete new one,
or nothing, never a dataset that opens partial; and once what the dead writer left is settled
(``lmdata clean --claims``, which settles a gone writer of this machine whatever its age), a
replaced dataset is the old one or the new one, never neither, and nothing of the writer is
left over.

Writers are stopped in this process (:mod:`tests.storage._faults`: every request after the k-th
fails, so the store holds what a kill there leaves): a Dolma tree replaced (the subject of issue
29) after every request, the other writes at changes of the kind of request sent (method and
object: claim, staged, data, metadata), where what is stored can change kind; and with real
SIGKILLs at a few of these points in tests/storage/test_s3_commits.py.
"""

from __future__ import annotations

import pytest

import lmdata
from lmdata.storage import clean, resolve
from lmdata.storage.manifest import SUFFIX as MANIFEST

from ._faults import SUFFIX, points, read, role, stop_after, write

FORMATS = [
    "dolma",
    "flat-tokens",
    "atlas",
    "modalities",
    "modalities-jsonl",
    "mds",
    "mds-jsonl",
    "mds-csv",
    "mds-tsv",
    "jsonl",
]
OLD, NEW = 5, 7  # records of the old and the new dataset
# points per write (new, replace; None: after every request): a Dolma replace after every
# request, the others at their changes of kind, as many as shown (the MDS formats that differ
# from mds only in how a shard encodes its samples, fewer)
BUDGET = {
    "dolma": (3, None),
    "modalities": (None, None),
    "jsonl": (None, None),
    "mds-jsonl": (1, 1),
    "mds-csv": (0, 1),
    "mds-tsv": (0, 1),
}
DEFAULT_BUDGET = (2, 3)


def _journal(log):
    """The number of requests after which a write's commit journal is in its claim (its claim
    written again, last before the commit touches the destination), or None for a write that
    keeps none."""
    claims = [i for i, (m, k) in enumerate(log) if m == "put_object" and role(k) == "claim"]
    touch = next((i for i, (_, k) in enumerate(log) if role(k) in ("data", "meta", "marker")), 0)
    before = [i for i in claims if i < touch]
    return before[-1] + 1 if len(before) > 1 else None


def _copy(store, src, dst):
    """A copy of the dataset at key ``src`` (a modalities-jsonl file with its index, a file
    with the manifest beside it: a replace must never leave it stale)."""
    fs = store.fs
    fs.copy(src, dst, recursive=fs.isdir(src))
    index = src[: -len(".jsonl")] + ".idx"
    if src.endswith(".jsonl") and fs.exists(index):
        fs.copy(index, dst[: -len(".jsonl")] + ".idx")
    if fs.exists(src + MANIFEST):
        fs.copy(src + MANIFEST, dst + MANIFEST)


def _leftovers(store, root):
    """lmdata's objects left over below ``root``: a manifest beside a file is one only
    without its file."""
    store.fs.invalidate_cache()
    found = set(store.fs.find(root))
    return sorted(
        k
        for k in found
        if ".lmdata-" in k and not (k.endswith(MANIFEST) and k[: -len(MANIFEST)] in found)
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_writer_stopped_after_any_request_leaves_old_or_new(s3_root, fmt):
    store, root = resolve(s3_root)
    suffix = SUFFIX.get(fmt, "")

    def url(name):
        return f"{s3_root}/{name}{suffix}"

    def key(name):
        return f"{root}/{name}{suffix}"

    with stop_after(None) as fresh:  # a complete write to a new URL, and what it sends
        write(fmt, url("new"), "new", NEW)
    new = read(fmt, url("new"))
    write(fmt, url("old"), "old", OLD)
    old = read(fmt, url("old"))
    assert new is not None and old is not None and new != old
    _copy(store, key("old"), key("probe"))
    with stop_after(None) as replacing:  # a complete replace, and what it sends
        write(fmt, url("probe"), "new", NEW, overwrite=True)
    assert read(fmt, url("probe")) == new

    budget_new, budget_replace = BUDGET.get(fmt, DEFAULT_BUDGET)
    check = fmt == "dolma"  # `lmdata validate` too (it passed a partial Dolma tree)
    first = {}  # (kind, k) -> what a reader accepts right after the writer stopped
    for k in points(fresh.log, budget_new):
        with stop_after(k) as st:
            with pytest.raises(Exception):  # noqa: B017 (whatever the writer meets, it stops)
                write(fmt, url(f"n{k}"), "new", NEW)
        assert st.stopped
        got = read(fmt, url(f"n{k}"), check)
        assert got in (None, new), (fmt, "new write", k, fresh.log[:k])
        first["n", k] = got
    for k in points(replacing.log, budget_replace):
        _copy(store, key("old"), key(f"r{k}"))
        with stop_after(k) as st:
            with pytest.raises(Exception):  # noqa: B017
                write(fmt, url(f"r{k}"), "new", NEW, overwrite=True)
        assert st.stopped
        got = read(fmt, url(f"r{k}"), check)
        assert got in (None, old, new), (fmt, "replace", k, replacing.log[:k])
        first["r", k] = got

    clean(s3_root, claims=True)  # gone writers of this machine: settled at once
    assert _leftovers(store, root) == []
    j_new, j_rep = _journal(fresh.log), _journal(replacing.log)
    for (kind, k), before in sorted(first.items()):
        after = read(fmt, url(f"{kind}{k}"))
        where = (fmt, kind, k, before is not None, (replacing if kind == "r" else fresh).log[:k])
        if kind == "n":  # a new write: nothing, or the new dataset once it committed
            assert after in (None, new), where
            if before == new or (j_new is not None and k >= j_new and fmt == "dolma"):
                assert after == new, where  # a commit under way is finished
        elif j_rep is not None and k >= j_rep:
            assert after == new, where  # the journal finishes the commit: never neither
        else:
            assert after == (before if before is not None else old), where


def test_a_dolma_tree_being_committed_is_refused_by_every_reader(s3_root):
    """A replace of a Dolma tree stopped right after it marked the tree: lmdata.open, validate
    and the toolkit's document globs all refuse it (one message, naming the way out), and the
    tree is still told for a Dolma one; `lmdata clean --claims` finishes the commit."""
    from lmdata import formats
    from lmdata.errors import FormatError
    from lmdata.formats.dolma._paths import expand_globs

    url = f"{s3_root}/d.dolma"
    write("dolma", url, "old", OLD)
    with stop_after(None) as full:
        write("dolma", url, "new", NEW, overwrite=True)
    write("dolma", url, "old", OLD, overwrite=True)
    k = next(i for i, (_, key) in enumerate(full.log) if role(key) == "marker") + 1
    with stop_after(k), pytest.raises(Exception):  # noqa: B017
        write("dolma", url, "new", NEW, overwrite=True)
    assert formats.detect(url) == "dolma"
    for refuse in (
        lambda: lmdata.open(url),
        lambda: expand_globs([f"{url}/documents/*.jsonl.gz"]),
    ):
        with pytest.raises(FormatError, match="--claims"):
            refuse()
    (problem,) = lmdata.validate(url, format="dolma")
    assert "lmdata clean" in problem
    clean(url, claims=True)
    assert [d["id"] for d in lmdata.open(url)] == [f"new-{i}" for i in range(NEW)]
