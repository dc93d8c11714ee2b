"""``lmdata.storage.clean`` / ``lmdata clean``: what killed writers leave is found by name and
removed; datasets, running writers' objects (recent) and committed data are left alone."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.errors import InvalidInputError
from lmdata.storage import AtomicOutput, claims, clean, parse_age, resolve
from lmdata.storage.claims import claim_body, claim_key


def _mds(url, ids, **kw):
    with lmdata.writer(url, "mds", **kw) as w:
        for i in ids:
            w.write({"id": i})


def _ids(url):
    return [x["id"] for x in lmdata.open(url)]


def _die():
    """The writers of this process stop as a killed one does: their claims stay, no writer
    holds them any more (a claim of a running writer of this machine is never taken)."""
    claims._LIVE.clear()


def _elsewhere(url):
    """The claim of ``url`` as a writer on another machine holds it: nothing tells whether
    it still runs."""
    store, key = resolve(url)
    body = json.loads(store.read(claim_key(key)))
    store.put(claim_key(key), json.dumps({**body, "machine": "another"}).encode())


def test_local_staged_output_is_removed_and_datasets_kept(tmp_path):
    _mds(str(tmp_path / "ok"), [1])
    dead = AtomicOutput(tmp_path / "sub" / "ds", directory=True, overwrite=False)
    (dead.tmp / "shard.00000.mds").write_bytes(b"x" * 100)  # a writer killed here
    empty = AtomicOutput(tmp_path / "e", directory=True, overwrite=False)  # killed at once
    assert clean(tmp_path, older_than=3600) == []  # recent: maybe a running writer's
    found = clean(tmp_path, older_than=0, dry_run=True)
    assert sorted((f.kind, f.url, f.bytes) for f in found) == sorted(
        [("staged", str(dead.tmp), 100), ("staged", str(empty.tmp), 0)]
    )
    assert dead.tmp.exists()  # a dry run removes nothing
    assert len(clean(tmp_path, older_than=0)) == 2
    assert not dead.tmp.exists() and not empty.tmp.exists()
    assert sorted(os.listdir(tmp_path)) == ["ok", "sub"] and _ids(str(tmp_path / "ok")) == [1]


def test_s3_staged_replacement_is_removed_and_the_old_dataset_kept(s3_root):
    url = f"{s3_root}/ds"
    _mds(url, [1])
    w = lmdata.writer(url, "mds", overwrite=True)
    w.write({"id": 2})
    _die()  # nothing cleans up
    store, key = resolve(s3_root)
    staged = [n for n in store.list(key) if n.startswith(".lmdata-tmp-ds-")]
    if not staged:  # the MDS writer buffers a small shard until close: flush one object
        w._out.write("shard.00000.mds", b"x" * 10)
        staged = [n for n in store.list(key) if n.startswith(".lmdata-tmp-ds-")]
    assert len(staged) == 1
    assert clean(s3_root, older_than=0) == []  # staged copies go with their claim
    found = clean(s3_root, claims=True)  # a writer of this machine that is gone: at once
    assert [(f.kind, f.url) for f in found] == [("unfinished", f"{s3_root}/{staged[0]}")]
    fresh, _ = resolve(s3_root)
    assert not any(n.startswith(".lmdata-tmp-") for n in fresh.list(key))
    assert _ids(url) == [1]


def test_s3_unfinished_new_write_goes_only_with_claims(s3_root):
    url = f"{s3_root}/new"
    w = lmdata.writer(url, "mds")
    w._out.write("shard.00000.mds", b"partial")  # then the writer dies, on another machine
    _die()
    _elsewhere(url)
    assert clean(s3_root, older_than=0) == []  # a claim may be a running writer's: not asked
    with pytest.raises(lmdata.errors.OutputExistsError, match="--claims --older-than 0"):
        lmdata.writer(url, "mds", overwrite=True)
    assert clean(s3_root, claims=True) == []  # recent, and maybe running elsewhere
    found = clean(s3_root, older_than=0, claims=True)
    assert [(f.kind, f.url, f.bytes > 7) for f in found] == [("unfinished", url, True)]
    store, key = resolve(url)
    assert not store.exists(key)
    _mds(url, [3])  # the URL is free again
    assert _ids(url) == [3]


def test_s3_claim_left_by_a_committed_write_goes_alone(s3_root):
    url = f"{s3_root}/done"
    _mds(url, [4])
    store, key = resolve(url)
    # killed between its commit objects and removing its claim (an older lmdata's claim was
    # inside the dataset; today's is beside it)
    for claim in (f"{key}/.lmdata-writing", claim_key(key)):
        store.put(claim, claim_body(committing=["index.json"]))
        found = clean(s3_root, claims=True)  # a finished write's claim: whatever its age
        assert [(f.kind, f.url) for f in found] == [("claim", store.url(claim))]
        assert _ids(url) == [4] and not resolve(url)[0].exists(claim)


def test_cli_clean_on_s3_with_storage_options(s3_server, s3_root, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the endpoint comes from --storage-option only
    url = f"{s3_root}/cli"
    w = lmdata.writer(url, "mds", storage_options=s3_server)
    w._out.write("a", b"1")
    _die()
    opts = [
        f"--storage-option=client_kwargs.endpoint_url={s3_server['client_kwargs']['endpoint_url']}"
    ]
    run = CliRunner().invoke
    res = run(cli, ["clean", s3_root, "--claims", "--older-than", "0", "--dry-run", *opts])
    assert res.exit_code == 0, res.output
    assert "unfinished" in res.output and url in res.output and "would remove 1" in res.output
    res = run(cli, ["clean", s3_root, "--claims", "--older-than=0", *opts])
    assert res.exit_code == 0 and "removed 1" in res.output
    assert not resolve(url, s3_server)[0].exists(resolve(url, s3_server)[1])
    res = run(cli, ["clean", s3_root, "--older-than", "soon", *opts])
    assert res.exit_code != 0 and "not an age" in res.output


def test_parse_age():
    assert [parse_age(t) for t in ("90", "30s", "15m", "2h", "1d", "0")] == [
        90,
        30,
        900,
        7200,
        86400,
        0,
    ]
    # nan compares false with every age, so it would count a running writer's objects too
    for bad in ("", "h", "-1h", "1w", "nan", "nanm"):
        with pytest.raises(InvalidInputError):
            parse_age(bad)


def test_local_staged_dir_committed_during_the_walk_is_skipped(tmp_path, monkeypatch):
    """A running writer renames its staged directory into place between the walk's listing
    and the stat: that directory is no leftover, and no raw FileNotFoundError escapes."""
    import sys

    clean_mod = sys.modules["lmdata.storage.clean"]  # (the package's `clean` is the function)
    staged = AtomicOutput(tmp_path / "ds", directory=True, overwrite=False)
    real_walk = os.walk

    def walk(top, *a, **kw):
        for root, dirs, files in real_walk(top, *a, **kw):
            if str(staged.tmp) in [os.path.join(root, d) for d in dirs]:
                os.rename(staged.tmp, tmp_path / "ds")  # the commit, just after the listing
            yield root, dirs, files  # dirs as listed, the staged one among them

    monkeypatch.setattr(clean_mod.os, "walk", walk)
    assert clean(tmp_path, older_than=0) == []
    assert (tmp_path / "ds").is_dir()


def test_clean_of_a_url_with_nothing_there_is_an_error(memory_root):
    """As for a local path (refused by the CLI): a mistyped URL is no "removed 0 leftovers"."""
    from lmdata.errors import DatasetNotFoundError

    with pytest.raises(DatasetNotFoundError):
        clean(f"{memory_root}/no-such-folder", older_than=0)
    res = CliRunner().invoke(cli, ["clean", f"{memory_root}/no-such-folder"])
    assert res.exit_code != 0 and "removed" not in res.output


def test_a_staged_folder_is_judged_by_its_newest_entry(tmp_path, memory_root):
    # a running job's piece folder whose old pieces wait for their join stays while the job
    # marks it recent: locally the folder's own time, on a store an object in it
    old = 7200
    folder = tmp_path / ".lmdata-tmp-parts-abc-a.jsonl"
    folder.mkdir()
    for name in ("a.jsonl.000000", "a.jsonl.000000.done"):
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (os.path.getmtime(folder) - old,) * 2)
    aged = os.path.getmtime(folder) - old
    os.utime(folder, (aged, aged))
    assert [f.url for f in clean(tmp_path, older_than=3600, dry_run=True)] == [str(folder)]
    os.utime(folder)  # the job marks it fresh
    assert clean(tmp_path, older_than=3600) == [] and folder.exists()
    store, key = resolve(f"{memory_root}/.lmdata-tmp-parts-abc-a.jsonl/alive")
    store.put(key, b"")
    assert clean(memory_root, older_than=3600) == []
    assert len(clean(memory_root, older_than=0)) == 1


def test_resumable_job_staging_is_listed_and_kept_unless_asked(tmp_path, s3_root):
    # an interrupted tokenize/convert keeps its staging for --resume: clean shows it, keeps it,
    # and removes it only with resumable=True (--resumable)
    from lmdata.parallel.staging import prepare, staging_for

    for root in (str(tmp_path), s3_root):
        for job in ("work", "convert"):
            work = staging_for(f"{root}/out-{job}", None, job)
            prepare(work, b'{"job": 1}', resume=False)
            work.mark_done(0, 0)
        found = clean(root, older_than=0)
        assert sorted((f.kind, f.url.rsplit("/", 1)[-1], f.remove) for f in found) == [
            ("resumable", ".out-convert.lmdata-convert", ()),
            ("resumable", ".out-work.lmdata-work", ()),
        ]
        assert staging_for(f"{root}/out-work", None).exists()
        gone = clean(root, older_than=0, resumable=True)
        assert len(gone) == 2 and all(f.remove for f in gone)
        assert not staging_for(f"{root}/out-work", None).exists()
        assert not staging_for(f"{root}/out-convert", None, "convert").exists()


def test_cli_clean_says_a_resumable_folder_is_kept(tmp_path):
    from lmdata.parallel.staging import prepare, staging_for

    prepare(staging_for(str(tmp_path / "out"), None), b"{}", resume=False)
    res = CliRunner().invoke(cli, ["clean", str(tmp_path), "--older-than", "0"])
    assert res.exit_code == 0, res.output
    assert "resumable" in res.output and "kept" in res.output
    assert "removed 0 leftover(s)" in res.output
    assert (tmp_path / ".out.lmdata-work").exists()
    res = CliRunner().invoke(cli, ["clean", str(tmp_path), "--older-than", "0", "--resumable"])
    assert res.exit_code == 0 and "removed 1 leftover(s)" in res.output
    assert not (tmp_path / ".out.lmdata-work").exists()
