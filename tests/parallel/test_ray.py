"""The Ray engine gives byte-identical output to the local engine, also when a task dies."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from lmdata.convert import convert  # noqa: E402
from lmdata.dolma.config import DedupeConfig, MixerConfig, TagConfig, load_config  # noqa: E402
from lmdata.dolma.dedupe import dedupe  # noqa: E402
from lmdata.dolma.mixer import mix  # noqa: E402
from lmdata.dolma.tag import tag  # noqa: E402
from lmdata.parallel import make_executor  # noqa: E402
from lmdata.tokenize.pipeline import TokenizeJob, tokenize  # noqa: E402
from tests.parallel._ray_local import FaultyRay, started_ray  # noqa: E402

DOLMA = Path(__file__).parent.parent / "data" / "dolma"


@pytest.fixture(scope="module")
def fail_dir(tmp_path_factory: pytest.TempPathFactory):
    """One local Ray instance for the module, started once (each start costs seconds), and
    the folder of :class:`FaultyRay`, where a test drops ``fail-N`` to kill the worker
    running unit N of a job."""
    d = tmp_path_factory.mktemp("ray-faults")
    with started_ray():
        yield d


def tree_bytes(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    docs = [{"id": f"d{i}", "text": "é word" * int(rng.integers(1, 80))} for i in range(900)]
    with open(d / "a.jsonl", "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in docs[:600])
    with gzip.open(d / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(x) + "\n" for x in docs[600:])
    return d


def _tokenize(corpus: Path, dst: Path, engine: str, **kw: object) -> None:
    job = TokenizeJob(to="flat-tokens", tokenizer="bytes", batch_docs=50, validation_fraction=0.2)
    if "executor" in kw:
        tokenize([corpus], dst, job, **kw)
    else:
        tokenize([corpus], dst, job, engine=engine, workers=2, **kw)


@pytest.fixture(scope="module")
def local_tokens(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    dst = tmp_path_factory.mktemp("local") / "out"
    _tokenize(corpus, dst, "inprocess")
    return tree_bytes(dst)


@pytest.mark.parametrize("fail", [False, True])
def test_tokenize_on_ray_is_byte_identical(
    fail_dir: Path, corpus: Path, local_tokens: dict[str, bytes], tmp_path: Path, fail: bool
) -> None:
    from lmdata.tokenize.sources import list_inputs, plan_units

    # a.jsonl (plain) is cut into byte ranges, b.jsonl.gz stays one unit
    units = plan_units(list_inputs([corpus]), 9000)
    assert [u.file_index for u in units].count(0) > 4 and units[-1].file_index == 1
    if fail:  # the worker running unit 3 (a byte range of a.jsonl) dies once; Ray retries it
        (fail_dir / "fail-3").touch()
    _tokenize(corpus, tmp_path / "ray", "ray", range_bytes=9000, executor=FaultyRay(fail_dir, 2))
    assert not (fail_dir / "fail-3").exists()  # the fault did fire
    assert tree_bytes(tmp_path / "ray") == local_tokens


def test_memory_inputs_on_one_ray_worker_are_copied_for_it(
    fail_dir: Path, corpus: Path, tmp_path: Path
) -> None:
    # one Ray worker is still another process: it reads a local copy of memory:// inputs
    import fsspec

    import lmdata
    from tests.tokenize.test_api import files

    fs = fsspec.filesystem("memory")
    for f in corpus.iterdir():
        fs.pipe(f"/ray-one/{f.name}", f.read_bytes())
    opts = dict(format="flat-tokens", tokenizer="bytes", batch_docs=50, validation_fraction=0.2)
    lmdata.tokenize(corpus, tmp_path / "local", engine="inprocess", **opts)
    lmdata.tokenize("memory://ray-one/", tmp_path / "ray", engine="ray", workers=1, **opts)
    assert files(tmp_path / "ray") == files(tmp_path / "local")  # provenance without command


@pytest.mark.parametrize("fail", [False, True])
def test_convert_on_ray_is_byte_identical(fail_dir: Path, corpus: Path, tmp_path: Path, fail):
    _tokenize(corpus, tmp_path / "tok", "inprocess", overwrite=True)
    convert(tmp_path / "tok", tmp_path / "local", "mds", split="train", engine="inprocess")
    if fail:
        (fail_dir / "fail-0").touch()
    ex = FaultyRay(fail_dir, 2)
    convert(tmp_path / "tok", tmp_path / "ray", "mds", split="train", executor=ex)
    assert not (fail_dir / "fail-0").exists()
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_convert_records_on_ray_stage_and_are_byte_identical(fail_dir: Path, tmp_path: Path):
    docs = [{"id": i, "text": "é" * (i % 40), "blob": {"k": [i, None]}} for i in range(1200)]
    (tmp_path / "src.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    convert(tmp_path / "src.jsonl", tmp_path / "local", "mds", engine="inprocess")
    (fail_dir / "fail-1").touch()  # a block's worker dies once: its part is written again
    convert(tmp_path / "src.jsonl", tmp_path / "ray", "mds", executor=FaultyRay(fail_dir, 2))
    assert not (fail_dir / "fail-1").exists()
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def _dolma_tree(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(DOLMA, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.rmtree(root / "dataset" / "attributes")
    return root


def _dolma_steps(root: Path, engine: str, executor: object = None) -> None:
    """tag, dedupe (documents and paragraphs) and mix, as the fixture's attributes were made
    (on ``executor`` if given)."""
    on = {"executor": executor} if executor is not None else {"engine": engine}
    ds = root / "dataset"
    docs = [str(ds / "documents" / "*.jsonl.gz")]
    for exp, taggers in (
        ("exp", ["char_length_v1", "random_number_v1"]),
        ("pii-regex", ["pii_regex_v2"]),
    ):
        cfg = TagConfig.from_dict(
            {"documents": docs, "taggers": taggers, "experiment": exp, "processes": 2}
        )
        tag(cfg, **on)  # type: ignore[arg-type]
    url = {"attribute_name": "bff_duplicate_url", "key": "$.metadata.url"}
    para = {"attribute_name": "bff_duplicate_paragraph_spans"}
    for name, mode in (
        ("dedupe_docs", {"documents": url}),
        ("dedupe_paragraphs", {"paragraphs": para}),
    ):
        d = {"name": name, "skip_empty": True, **mode}
        dedupe(DedupeConfig.from_dict({"documents": docs, "dedupe": d, "processes": 2}), **on)  # type: ignore[arg-type]
    cfg = load_config(str(root / "configs" / "mix.yaml"))
    mix(MixerConfig.from_dict({**cfg, "processes": 2}), base=root, **on)  # type: ignore[arg-type]


def test_tag_dedupe_mix_on_ray_are_byte_identical(fail_dir: Path, tmp_path: Path) -> None:
    trees = {}
    for engine in ("inprocess", "ray"):  # the local engines agree with each other (tests/dolma)
        root = _dolma_tree(tmp_path, engine)
        faulty = None
        if engine == "ray":  # the first unit of the first Ray job dies once
            (fail_dir / "fail-1").touch()
            faulty = FaultyRay(fail_dir, 2)
        _dolma_steps(root, engine, faulty)
        trees[engine] = tree_bytes(root)
    assert not (fail_dir / "fail-1").exists()
    assert trees["ray"] == trees["inprocess"]
    assert any(k.startswith("dataset/attributes/dedupe_paragraphs") for k in trees["ray"])
    assert any(k.startswith("mixed/") for k in trees["ray"])


def test_an_lmdata_error_in_a_ray_task_is_raised_as_itself(fail_dir: Path, tmp_path: Path):
    from lmdata.errors import InvalidInputError

    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(InvalidInputError, match="malformed JSON"):
        _tokenize(tmp_path / "bad.jsonl", tmp_path / "out", "ray")


def test_ray_window_follows_the_cluster(fail_dir: Path) -> None:
    ex = make_executor("ray")
    assert ex.workers == 2
    assert list(ex.map_ordered(abs, range(-30, 0))) == list(range(30, 0, -1))


def test_ray_runs_at_most_workers_units_at_once(fail_dir: Path, tmp_path: Path) -> None:
    counter = tmp_path / "running"
    counter.write_text("0 0")

    def unit(i: int) -> int:
        """Counts the units running now (under a lock) and keeps the highest count seen."""
        import fcntl
        import time

        def add(d: int) -> None:
            with open(counter, "r+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                now, most = map(int, f.read().split())
                f.seek(0)
                f.write(f"{now + d} {max(most, now + d)}")
                f.truncate()

        add(1)
        time.sleep(0.15)  # long enough for a second task on the other CPU to start
        add(-1)
        return i

    # the cluster has 2 CPUs; workers=1 must keep it to one unit at a time
    ex = make_executor("ray", workers=1)
    assert list(ex.map_ordered(unit, range(5))) == list(range(5))
    assert counter.read_text() == "0 1"


def test_ray_reports_progress_as_units_finish(fail_dir: Path) -> None:
    from lmdata import parallel

    seen: list[int] = []
    out = list(
        make_executor("ray").map_ordered(parallel.report, [5, 0, 7, 3], on_report=seen.append)
    )
    assert out == [None] * 4
    assert sorted(seen) == [3, 5, 7]  # each unit's documents, once (order: as they finish)


def test_interrupted_ray_job_resumes_without_redoing_finished_files(
    fail_dir: Path, corpus: Path, local_tokens: dict[str, bytes], tmp_path: Path
) -> None:
    from lmdata.tokenize.pipeline import work_dir_for

    job = TokenizeJob(to="flat-tokens", tokenizer="bytes", batch_docs=50, validation_fraction=0.2)
    calls = {"n": 0}

    def stop_midway(e: object) -> None:
        if getattr(e, "unit", None) != "documents":  # one count of documents per unit
            return
        calls["n"] += 1
        if calls["n"] == 14:  # inside the second input file (a.jsonl has 12 units)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize([corpus], tmp_path / "out", job, engine="ray", workers=2, progress=stop_midway)
    assert (work_dir_for(tmp_path / "out") / "done.log").read_text() == "000000-000000\n"
    seen: list[float] = []
    tokenize(
        [corpus],
        tmp_path / "out",
        job,
        engine="ray",
        workers=2,
        resume=True,
        progress=lambda e: seen.append(e.done) if e.unit == "documents" else None,
    )
    assert seen[-1] == 300  # only the unfinished file (b.jsonl.gz) was tokenized again
    assert tree_bytes(tmp_path / "out") == local_tokens


def test_a_ray_retry_of_a_written_mix_shard_is_counted_once(fail_dir: Path, tmp_path: Path):
    """A worker that dies after committing its shard: the retry finds the shard written by its
    own earlier attempt and counts it (not "kept"), so the counts are the local engine's."""
    docs = tmp_path / "t" / "documents"
    docs.mkdir(parents=True)
    for k in range(3):
        rows = [{"id": f"{k}-{i}", "text": "w " * (i % 7)} for i in range(40)]
        (docs / f"p{k}.jsonl.gz").write_bytes(
            gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
        )

    def cfg(out: str) -> MixerConfig:
        output = {"path": str(tmp_path / out), "max_size_in_bytes": 1, "min_text_length": 3}
        stream = {
            "name": "s",
            "documents": [str(docs / "*.gz")],
            "output": output,
            "filter": {"exclude": ["$.metadata[?(@.drop > 0.5)]"]},  # (dolma needs one)
        }
        return MixerConfig.from_dict({"streams": [stream], "processes": 2})

    local = mix(cfg("local"), engine="inprocess")
    (fail_dir / "fail-after-1").touch()
    got = mix(cfg("ray"), executor=FaultyRay(fail_dir))
    assert not (fail_dir / "fail-after-1").exists()  # the fault did fire
    counts = ("shards", "skipped_shards", "read", "written", "too_short")
    assert [getattr(got, c) for c in counts] == [getattr(local, c) for c in counts]
    assert got.skipped_shards == 0 and got.shards == 3 and got.too_short > 0
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    again = mix(cfg("ray"), engine="ray")  # shards there before the job are kept, as locally
    assert again.skipped_shards == 3 and again.read == 0


def test_a_mix_filter_on_an_absent_attribute_is_named_from_ray_units(
    fail_dir: Path, tmp_path: Path
) -> None:
    """The attribute names a unit saw come back from Ray tasks in its result: the warning
    (did-you-mean included) is the local engine's."""
    root = tmp_path / "fx"
    shutil.copytree(DOLMA, root)
    cfg = load_config(str(root / "configs" / "mix.yaml"))
    cfg["streams"][0]["filter"]["include"] = ["$.attributes[?(@.exp__char_length_v1__doc)]"]
    res = {}
    for engine in ("inprocess", "ray"):
        cfg["streams"][0]["output"]["path"] = f"mixed-{engine}"
        res[engine] = mix(MixerConfig.from_dict(cfg), base=root, engine=engine)
    assert res["ray"].warnings == res["inprocess"].warnings
    (line,) = res["ray"].warnings
    assert "did you mean 'exp__char_length_v1__length'?" in line


def test_dedupe_of_one_large_file_on_ray_is_split_and_byte_identical(
    fail_dir: Path, tmp_path: Path
) -> None:
    """One plain file larger than range_bytes is hashed and written as several Ray units; a
    hash unit dying before it ran and a write unit dying after it wrote its piece are retried,
    and the attribute file is that of one local unit for the whole file."""
    texts = ["a b\nc d", "c d", "e f g", "a b", "x\n\ny z"]
    rows = [{"id": f"d{i}", "text": texts[i % 5] + f"\n{i % 13}"} for i in range(400)]
    docs = tmp_path / "documents"
    docs.mkdir()
    (docs / "big.jsonl").write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    cfg = DedupeConfig.from_dict(
        {
            "documents": [str(docs / "*")],
            "dedupe": {"name": "d", "paragraphs": {"attribute_name": "p"}},
            "processes": 2,
        }
    )
    want = dedupe(cfg, engine="inprocess", range_bytes=1 << 40)
    whole = (tmp_path / "attributes" / "d" / "big.jsonl").read_bytes()
    # the jobs: hash, mark, write, join; a hash unit dies before it ran, a write unit after
    ex = FaultyRay(fail_dir, faults={0: ["fail-1"], 2: ["fail-after-2"]})
    got = dedupe(cfg, executor=ex, range_bytes=2000)
    assert not (fail_dir / "fail-1").exists() and not (fail_dir / "fail-after-2").exists()
    assert len(ex.jobs) == 4 and ex.jobs[0] >= 6 and ex.jobs[2] >= 6
    assert (got.documents, got.keys, got.duplicates) == (want.documents, want.keys, want.duplicates)
    assert (tmp_path / "attributes" / "d" / "big.jsonl").read_bytes() == whole
    assert sorted(p.name for p in (tmp_path / "attributes" / "d").iterdir()) == ["big.jsonl"]
