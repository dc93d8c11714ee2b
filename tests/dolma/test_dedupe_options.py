"""dolma dedupe options lmdata honours with exact keys: key partitions (num_partitions +
partition_index), file partitions, document_dir, and bloom_filter.file / read_only (a key
file)."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.dolma import _keyfile
from lmdata.dolma import dedupe as dd
from lmdata.dolma._buckets import in_partition as from_partition
from lmdata.dolma._dedupe_resume import Resumable
from lmdata.dolma.config import DedupeConfig, file_partition
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats.dolma._paths import Stores

URL = {"documents": {"attribute_name": "a", "key": "$.text"}}
PARA = {"paragraphs": {"attribute_name": "a"}}


def _write(root: Path, files: list[list[str]], folder: str = "documents") -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    for k, texts in enumerate(files):
        rows = [orjson.dumps({"id": f"{k}-{i}", "text": t}) + b"\n" for i, t in enumerate(texts)]
        (root / folder / f"f{k}.jsonl.gz").write_bytes(gzip.compress(b"".join(rows)))


def _cfg(root: Path, mode: dict, folder: str = "documents", bloom=None, **dedupe) -> DedupeConfig:
    d = {
        "documents": [str(root / folder / "*.jsonl.gz")],
        "dedupe": {"name": "n", **mode, **dedupe},
    }
    if bloom is not None:
        d["bloom_filter"] = bloom
    return DedupeConfig.from_dict(d)


def _attrs(root: Path, name: str, nfiles: int) -> list[list[dict]]:
    out = []
    for k in range(nfiles):
        raw = gzip.decompress((root / "attributes" / name / f"f{k}.jsonl.gz").read_bytes())
        out.append([orjson.loads(line)["attributes"] for line in raw.splitlines()])
    return out


def _run(cfg: DedupeConfig) -> dd.DedupeResult:
    return dd.dedupe(cfg, engine="inprocess")


texts = st.lists(
    st.lists(st.sampled_from(["a", "b", "c", "d", "e", "", "f g"]), min_size=1, max_size=4).map(
        "\n".join
    ),
    min_size=1,
    max_size=8,
)
corpora = st.lists(texts, min_size=1, max_size=3)
SETTINGS = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(files=corpora, parts=st.integers(2, 3), mode=st.sampled_from([URL, PARA]))
def test_key_partitions_together_mark_what_one_run_marks(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[str]], parts: int, mode: dict
) -> None:
    root = tmp_path_factory.mktemp("ds")
    _write(root, files)
    _run(_cfg(root, mode))
    whole = _attrs(root, "n", len(files))
    runs = []
    for i in range(parts):
        cfg = _cfg(root, mode, num_partitions=parts, partition_index=i)
        assert (cfg.out_name, cfg.out_attribute) == (f"n_{i}", f"a_{i}")  # dolma's names
        _run(cfg)
        runs.append(_attrs(root, f"n_{i}", len(files)))
    for k, rows in enumerate(whole):
        for j, row in enumerate(rows):
            if "a" not in row:  # a first copy: no partition flags it (or it is not theirs)
                assert all(r[k][j].get(f"a_{i}", []) == [] for i, r in enumerate(runs))
                continue
            got = sorted(s for i, r in enumerate(runs) for s in r[k][j].get(f"a_{i}", []))
            assert got == sorted(row["a"])
            if mode is URL and row["a"]:  # a duplicate key: exactly one partition has it
                assert sum(bool(r[k][j].get(f"a_{i}")) for i, r in enumerate(runs)) == 1


def test_a_document_key_of_another_partition_is_empty(tmp_path: Path) -> None:
    """dolma writes ``[]`` for a document whose key is another partition's, and nothing for a
    first copy of its own."""
    root = tmp_path / "ds"
    _write(root, [["x", "x", "y", "y", "z", "z"]])
    seen = []
    for i in range(2):
        _run(_cfg(root, URL, num_partitions=2, partition_index=i))
        seen.append(_attrs(root, f"n_{i}", 1)[0])
    for j in range(0, 6, 2):  # the first copy of a key, then its duplicate
        mine = [i for i in range(2) if seen[i][j] == {}]
        assert len(mine) == 1
        (i,) = mine
        assert seen[1 - i][j] == {f"a_{1 - i}": []} and seen[1 - i][j + 1] == {f"a_{1 - i}": []}
        assert seen[i][j + 1] == {f"a_{i}": [[0, 1, 1]]}


def test_ngram_partitions_split_the_score(tmp_path: Path) -> None:
    """A paragraph's n-gram score in a partition counts that partition's duplicate n-grams
    over all its n-grams (dolma's), so the partitions' scores add up to the whole run's; a
    short paragraph (whole-text fallback) is checked in every partition, as dolma does."""
    root = tmp_path / "ds"
    long = "one two three four five six seven eight"
    _write(root, [[long, long + "\nshort", "short\n" + long]])
    mode = {"paragraphs": {"attribute_name": "a", "by_ngram": {"ngram_length": 2}}}
    mode["paragraphs"]["by_ngram"]["overlap_threshold"] = 0.0
    _run(_cfg(root, mode))
    whole = _attrs(root, "n", 1)[0]
    runs = []
    for i in range(3):
        _run(_cfg(root, mode, num_partitions=3, partition_index=i))
        runs.append(_attrs(root, f"n_{i}", 1)[0])
    for j, row in enumerate(whole):
        for s, (start, end, score) in enumerate(row["a"]):
            spans = [r[j][f"a_{i}"][s] for i, r in enumerate(runs)]
            assert all(sp[:2] == [start, end] for sp in spans)
            if end - start <= len("short") + 1:  # the fallback: the same in every partition
                assert [sp[2] for sp in spans] == [score] * 3
            else:
                assert sum(sp[2] for sp in spans) == pytest.approx(score, abs=1e-6)


def test_file_partitions_split_the_files(tmp_path: Path) -> None:
    """With file_partition each run takes the files whose path hashes to its index, and, as
    dolma 1.2.1 does, still only the keys of its key partition, into ``<name>_<i>``: every
    file is written by exactly one run, with what a key-partitioned run of all the files
    would write for it if its files were the only ones."""
    root = tmp_path / "ds"
    files = [[f"t{k}", "same", f"t{k}", "same"] for k in range(8)]
    _write(root, files)
    owners: dict[str, int] = {}
    for i in range(3):
        cfg = _cfg(root, URL, num_partitions=3, partition_index=i, file_partition=True)
        assert (cfg.out_name, cfg.out_attribute) == (f"n_{i}", f"a_{i}")
        mine = cfg.document_files()
        for f in mine:
            assert Path(f).name not in owners
            owners[Path(f).name] = i
        if mine:
            assert _run(cfg).files == len(mine)
            written = sorted(p.name for p in (root / "attributes" / f"n_{i}").glob("*"))
            assert written == sorted(Path(f).name for f in mine)
    assert sorted(owners) == [f"f{k}.jsonl.gz" for k in range(8)]
    assert len(set(owners.values())) > 1  # the files do spread
    for k in range(8):
        i = owners[f"f{k}.jsonl.gz"]
        cfg = _cfg(root, URL, num_partitions=3, partition_index=i)
        raw = gzip.decompress((root / "attributes" / f"n_{i}" / f"f{k}.jsonl.gz").read_bytes())
        rows = [orjson.loads(line)["attributes"] for line in raw.splitlines()]
        for text, j in ((f"t{k}", 0), ("same", 1)):
            if from_partition(text, cfg):
                assert rows[j + 2] == {f"a_{i}": [[0, len(text), 1]]}  # its own repeat
            else:  # a key of another partition: dolma's []
                assert rows[j] == rows[j + 2] == {f"a_{i}": []}
    # the partition is of the path from the documents folder on: a moved copy keeps it
    cfg = _cfg(root, URL, num_partitions=3, file_partition=True)
    for name, i in owners.items():
        here = file_partition(str(root / "documents" / name), cfg)
        assert here == file_partition(f"s3://b/x/documents/{name}", cfg) == i


def test_a_file_partition_with_no_files_writes_its_key_file_empty(tmp_path: Path) -> None:
    """dolma 1.2.1 writes its Bloom filter at the end of every run, one of a file partition
    with no files too (checked by running it): here the key file, with no keys."""
    root = tmp_path / "ds"
    _write(root, [["x", "x"]])
    parts = {
        i: _cfg(root, URL, num_partitions=4, partition_index=i, file_partition=True)
        for i in range(4)
    }
    empty = next(i for i, c in parts.items() if not c.document_files())
    kf = tmp_path / "keys.bin"
    for save in (False, True):
        bloom = {"file": str(kf), "save_to_disk": save}
        cfg = _cfg(
            root, URL, bloom=bloom, num_partitions=4, partition_index=empty, file_partition=True
        )
        assert _run(cfg).files == 0
        assert kf.exists() == save  # save_to_disk false: none, as with files
    assert _keyfile.KeyFile(str(kf), None).keys == 0
    # an existing key file is kept as it is: it holds every key the run would add
    _run(_cfg(root, URL, bloom={"file": str(kf)}))  # every file, no partitions: the key "x"
    held = kf.read_bytes()
    assert _keyfile.KeyFile(str(kf), None).keys == 1
    bloom = {"file": str(kf)}
    _run(_cfg(root, URL, bloom=bloom, num_partitions=4, partition_index=empty, file_partition=True))
    assert kf.read_bytes() == held


def test_document_dir_names_the_folder_replaced(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _write(root, [["x", "x"]], folder="docs")
    _run(_cfg(root, URL, folder="docs", document_dir="docs"))
    assert _attrs(root, "n", 1) == [[{}, {"a": [[0, 1, 1]]}]]
    for folder in (root, root / "docs"):  # a dataset folder, or its docs/ folder
        d = {"documents": [str(folder)], "dedupe": {"name": "m", "document_dir": "docs", **URL}}
        assert DedupeConfig.from_dict(d).document_files() == [str(root / "docs" / "f0.jsonl.gz")]
    with pytest.raises(Exception, match="no 'documents' component"):
        _run(_cfg(root, URL, folder="docs"))
    with pytest.raises(InvalidInputError, match="one path component"):
        _cfg(root, URL, document_dir="a/b")


def test_partition_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="partition_index 2 is not below"):
        _cfg(tmp_path, URL, num_partitions=2, partition_index=2)
    with pytest.raises(InvalidInputError, match="num_partitions must be an integer >= 1"):
        _cfg(tmp_path, URL, num_partitions=0)
    with pytest.raises(InvalidInputError, match="file_partition must be true or false"):
        _cfg(tmp_path, URL, file_partition="yes")
    with pytest.raises(InvalidInputError, match=r"read_only needs bloom_filter\.file"):
        _cfg(tmp_path, URL, bloom={"read_only": True})


def test_resume_manifest_holds_the_new_options(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _write(root, [["x"]])
    bloom = {"file": str(tmp_path / "k.bin"), "read_only": False}
    cfg = _cfg(root, URL, bloom=bloom, num_partitions=2, partition_index=1)
    files = cfg.document_files()
    state = Resumable(cfg, files, [1], Stores(None))
    opts = state.identity["options"]
    for key in ("num_partitions", "partition_index", "file_partition", "document_dir"):
        assert key in opts
    assert str(tmp_path / "k.bin") in str(opts["bloom_filter"])


def test_decontamination_with_a_key_file(tmp_path: Path, caplog) -> None:
    """dolma's recipe: build the keys of eval data, then flag training paragraphs found in it
    with read_only (the training data's own repeats are not flagged, nor added)."""
    evals, train = tmp_path / "eval", tmp_path / "train"
    _write(evals, [["q1\nq2", "q3"]])
    _write(train, [["t1\nq2", "t1\nt2", "q3\nq1"]])
    keys = str(tmp_path / "keys.bin")
    _run(_cfg(evals, PARA, bloom={"file": keys, "read_only": False}))
    blob = Path(keys).read_bytes()
    assert blob[:8] == b"LMDKEYS1" and _keyfile.KeyFile(keys, None).keys == 3
    assert _attrs(evals, "n", 1) == [[{"a": []}, {"a": []}]]
    import logging

    with caplog.at_level(logging.WARNING, logger="lmdata.dolma.dedupe"):
        _run(_cfg(train, PARA, bloom={"file": keys, "read_only": True, "size_in_bytes": 1 << 20}))
    assert "not a Bloom filter" in caplog.text and "none added" in caplog.text
    assert "size_in_bytes" in caplog.text
    assert _attrs(train, "n", 1) == [[{"a": [[3, 5, 1]]}, {"a": []}, {"a": [[0, 3, 1], [3, 5, 1]]}]]
    assert Path(keys).read_bytes() == blob  # read_only: unchanged
    # read_only false with an existing file (dolma loads it): its keys count as seen, and the
    # run's keys are added
    _run(_cfg(train, PARA, name="m", bloom={"file": keys, "read_only": False}))
    assert _attrs(train, "m", 1) == [
        [{"a": [[3, 5, 1]]}, {"a": [[0, 3, 1]]}, {"a": [[0, 3, 1], [3, 5, 1]]}]
    ]
    assert _keyfile.KeyFile(keys, None).keys == 5  # q1 q2 q3 t1 t2


def test_key_file_with_many_buckets_and_parts(tmp_path: Path, monkeypatch) -> None:
    """The key file is read by bucket range (and in parts): the same marks however many."""
    evals, train = tmp_path / "eval", tmp_path / "train"
    words = [f"w{i}" for i in range(60)]
    _write(evals, [["\n".join(words[::2])]])
    _write(train, [["\n".join(words)], ["\n".join(words[::3])]])
    keys = str(tmp_path / "keys.bin")
    _run(_cfg(evals, PARA, bloom={"file": keys, "read_only": False}))
    _run(_cfg(train, PARA, bloom={"file": keys, "read_only": True}))
    want = _attrs(train, "n", 2)
    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 7)
    monkeypatch.setattr(dd, "SPILL_EVERY", 5)
    _run(_cfg(train, PARA, name="m", bloom={"file": keys, "read_only": True}))
    assert _attrs(train, "m", 2) == want
    flagged = [s[0] for s in want[0][0]["a"]]
    assert len(flagged) == 30  # the even words
    # and a key file written with many buckets equals one written with one
    keys2 = str(tmp_path / "keys2.bin")
    _run(_cfg(evals, PARA, name="m", bloom={"file": keys2, "read_only": False}))
    assert Path(keys2).read_bytes() == Path(keys).read_bytes()


def test_key_file_on_a_store(tmp_path: Path) -> None:
    evals, train = tmp_path / "eval", tmp_path / "train"
    _write(evals, [["x", "y"]])
    _write(train, [["y", "z", "z"]])
    url = "memory://lmdata-test-keys/k.bin"
    _run(_cfg(evals, URL, bloom={"file": url, "read_only": False}))
    _run(_cfg(train, URL, bloom={"file": url, "read_only": True}))
    assert _attrs(train, "n", 1) == [[{"a": [[0, 1, 1]]}, {}, {}]]


def test_dolma_bloom_filters_and_other_files_are_clear_errors(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _write(root, [["x"]])
    bf = tmp_path / "bf.bin"
    bf.write_bytes((0x81F0F117).to_bytes(4, "little") + (1).to_bytes(4, "little") + bytes(64))
    with pytest.raises(InvalidInputError, match=r"dolma \(Rust\) Bloom filter.*ahash"):
        _run(_cfg(root, URL, bloom={"file": str(bf), "read_only": True}))
    with pytest.raises(InvalidInputError, match="read_only false"):
        _run(_cfg(root, URL, bloom={"file": str(bf), "read_only": False}))
    bf.write_bytes(b"not keys at all")
    with pytest.raises(CorruptDataError, match="not an lmdata dedupe key file"):
        _run(_cfg(root, URL, bloom={"file": str(bf), "read_only": True}))
    with pytest.raises(InvalidInputError, match="does not exist"):
        _run(_cfg(root, URL, bloom={"file": str(tmp_path / "none.bin"), "read_only": True}))
    keys = str(tmp_path / "k.bin")
    _run(_cfg(root, URL, bloom={"file": keys, "read_only": False}))
    Path(keys).write_bytes(Path(keys).read_bytes()[:-3])
    with pytest.raises(CorruptDataError, match="truncated"):
        _run(_cfg(root, URL, bloom={"file": keys, "read_only": True}))
    ngram = {"paragraphs": {"attribute_name": "a", "by_ngram": {"ngram_length": 3}}}
    Path(keys).unlink()
    _run(_cfg(root, URL, bloom={"file": keys, "read_only": False}))
    with pytest.raises(InvalidInputError, match="raw keys and this run hashes ngram-3"):
        _run(_cfg(root, ngram, bloom={"file": keys, "read_only": True}))


def test_cli_builds_and_checks_a_key_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from lmdata.cli.main import cli

    evals, train = tmp_path / "eval", tmp_path / "train"
    _write(evals, [["q1\nq2"]])
    _write(train, [["q2\nt1"]])
    keys = str(tmp_path / "keys.bin")
    para = ["--dedupe.paragraphs.attribute_name", "a", "--dedupe.name", "n", "-q"]
    r = CliRunner().invoke(
        cli,
        ["dedupe", "-d", str(evals / "documents" / "*.gz"), *para, "--bloom_filter.file", keys],
    )
    assert r.exit_code == 0, r.output
    assert f"key file (exact keys, lmdata's format) -> {keys}" in r.output
    args = ["dedupe", "-d", str(train / "documents" / "*.gz"), *para, "--bloom_filter.file", keys]
    r = CliRunner().invoke(cli, [*args, "--bloom_filter.read_only", "--dedupe.num_partitions", "1"])
    assert r.exit_code == 0, r.output
    assert "-> attributes/n/" in r.output and "key file" not in r.output
    assert _attrs(train, "n", 1) == [[{"a": [[0, 3, 1]]}]]


@pytest.mark.parametrize("stop", ["_phase_mark", "_phase_write", "write", "keys"])
def test_a_stopped_run_with_a_key_file_resumes_to_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    from tests.dolma._units import Killed, counting

    monkeypatch.setattr(dd, "BUCKET_ENTRIES", 2)  # parts that depend on the key file's size
    root = tmp_path / "ds"
    _write(root, [["a\nb", "b\nc"], ["c\nd", "a"]])
    keys = tmp_path / "keys.bin"
    _write(tmp_path / "ev", [["d\ne"]])
    _run(_cfg(tmp_path / "ev", PARA, bloom={"file": str(keys), "read_only": False}))
    prior = keys.read_bytes()
    cfg = _cfg(root, PARA, bloom={"file": str(keys), "read_only": False}, work_dir=None)
    _run(cfg)
    want, want_keys = _attrs(root, "n", 2), keys.read_bytes()
    keys.write_bytes(prior)
    with monkeypatch.context() as mp:
        if stop == "keys":  # stopped after the key file is written, before the cleanup
            real = dd.Spill.mark

            def mark(self, name, *a, **kw):
                real(self, name, *a, **kw)
                if name == "keys":
                    raise Killed

            mp.setattr(dd.Spill, "mark", mark)
        elif stop == "write":  # stopped after the key file, before its marker

            def write(*a, **kw):
                real_write(*a, **kw)
                raise Killed

            real_write = _keyfile.write
            mp.setattr(_keyfile, "write", write)
        else:
            counting(mp, dd, stop, 0)
        with pytest.raises(Killed):
            _run(cfg)
    assert keys.read_bytes() == (want_keys if stop in ("write", "keys") else prior)
    dd.dedupe(cfg, engine="inprocess", resume=True)
    assert _attrs(root, "n", 2) == want and keys.read_bytes() == want_keys


@SETTINGS
@given(evals=corpora, train=corpora)
def test_read_only_flags_exactly_the_paragraphs_in_the_key_file(
    tmp_path_factory: pytest.TempPathFactory, evals: list[list[str]], train: list[list[str]]
) -> None:
    from lmdata.dolma._spans import split_paragraphs

    root = tmp_path_factory.mktemp("k")
    _write(root / "ev", evals)
    _write(root / "tr", train)
    keys = str(root / "keys.bin")
    _run(_cfg(root / "ev", PARA, bloom={"file": keys, "read_only": False}))
    seen = {p for texts in evals for t in texts if t for _, _, p in split_paragraphs(t, "\n")}
    assert _keyfile.KeyFile(keys, None).keys == len(seen)
    _run(_cfg(root / "tr", PARA, bloom={"file": keys, "read_only": True}))
    for texts, rows in zip(train, _attrs(root / "tr", "n", len(train)), strict=True):
        for t, row in zip(texts, rows, strict=True):
            want = [[s, e, 1] for s, e, p in split_paragraphs(t, "\n") if p in seen] if t else None
            assert row.get("a") == want
