"""dolma's command lines with ``lmdata`` in place of ``dolma``: space-separated lists, dolma's
dotted option spellings, ``--no-x`` booleans, ``-c CONFIG`` before or after the verb.

The expected files in tests/data/dolma/dolma121_cli were written by dolma 1.2.1 from the same
documents with the same command lines (see the README there).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.cli.tag import command as tag_command
from lmdata.dolma.cli_support import dolma_args

DATA = Path(__file__).parent.parent / "data" / "dolma"
THEIRS = DATA / "dolma121_cli"


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _raw(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


@pytest.fixture
def ds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "dataset" / "documents", tmp_path / "ds" / "documents")
    shutil.copytree(DATA / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "ds"


def test_tag_command_line_from_dolma(ds: Path) -> None:
    res = run(
        "tag",
        "--documents",
        f"{ds}/documents/*.jsonl.gz",
        "--taggers",
        "char_length_v1",
        "char_length_with_paragraphs_v1",
        "whitespace_tokenizer_v1",
        "--experiment",
        "cli",
        "--processes",
        "2",
        "--no-ignore_existing",
        "--work_dir.output",
        "work",
        "--debug",
    )
    assert res.exit_code == 0, res.output
    for part in ("part-0.jsonl.gz", "part-1.jsonl.gz"):
        assert _raw(ds / "attributes" / "cli" / part) == _raw(THEIRS / "tag_cli" / part)


@pytest.mark.parametrize("before", [True, False])
def test_tag_config_before_or_after_the_verb(ds: Path, before: bool) -> None:
    cfg = {
        "documents": [f"{ds}/documents/*.jsonl.gz"],
        "taggers": ["char_length_v1", "char_length_with_paragraphs_v1"],
        "experiment": "cli",
    }
    Path("tag.yaml").write_text(yaml.safe_dump(cfg))
    args = ["-c", "tag.yaml", "tag"] if before else ["tag", "-c", "tag.yaml"]
    # flags override the file, and a list flag replaces the file's list
    res = run(*args, "--taggers", "char_length_v1", "char_length_with_paragraphs_v1", "-q")
    assert res.exit_code == 0, res.output
    assert "tagged 200 documents" in res.output
    row = _raw(ds / "attributes" / "cli" / "part-0.jsonl.gz").split(b"\n")[0]
    assert b"cli__char_length_v1__length" in row and b"whitespace" not in row


@pytest.mark.parametrize("skip_empty", [True, False])
def test_dedupe_command_line_from_dolma(ds: Path, skip_empty: bool) -> None:
    """The docs' paragraph dedupe; without --dedupe.name the attribute name names the folder,
    and without --dedupe.skip_empty empty paragraphs are hashed, as in dolma."""
    args = [
        "dedupe",
        "--documents",
        f"{ds}/documents/*.jsonl.gz",
        "--dedupe.paragraphs.attribute_name",
        "bff_duplicate_paragraph_spans",
        *(["--dedupe.skip_empty"] if skip_empty else []),
        "--bloom_filter.file",
        f"{ds}/deduper_bloom_filter.bin",
        "--no-bloom_filter.read_only",
        "--bloom_filter.estimated_doc_count",
        "6000000",
        "--bloom_filter.desired_false_positive_rate",
        "0.0001",
        "--processes",
        "2",
    ]
    res = run(*args)
    assert res.exit_code == 0, res.output
    out = ds / "attributes" / "bff_duplicate_paragraph_spans"
    want = (
        DATA / "dataset" / "attributes" / "dedupe_paragraphs"
        if skip_empty
        else THEIRS / "dedupe_paragraphs_keep_empty"
    )
    for part in ("part-0.jsonl.gz", "part-1.jsonl.gz"):
        assert _raw(out / part) == _raw(want / part)


def test_mix_with_the_config_before_the_verb(ds: Path) -> None:
    shutil.copytree(ds, "dataset", dirs_exist_ok=True)
    shutil.copytree(DATA / "dataset" / "attributes", "dataset/attributes")
    res = run("-c", "configs/mix.yaml", "mix")
    assert res.exit_code == 0, res.output
    assert _raw(Path("mixed/fixture-mix-0000.jsonl.gz")) == _raw(
        THEIRS / "mixed" / "fixture-mix-0000.jsonl.gz"
    )
    # dolma names its last shard .json.gz by accident; lmdata keeps .jsonl.gz
    assert _raw(Path("mixed/fixture-mix-0001.jsonl.gz")) == _raw(
        THEIRS / "mixed" / "fixture-mix-0001.json.gz"
    )
    again = run("mix", "-c", "configs/mix.yaml", "--no-shuffle", "--dryrun")
    assert again.exit_code == 0 and '"output":"mixed/documents/part-0.jsonl.gz"' in again.output


def test_argument_forms_are_rewritten() -> None:
    assert dolma_args(
        tag_command,
        [
            "--taggers",
            "a",
            "b",
            "-t",
            "c",
            "--documents=x",
            "--experiment",
            "e",
            "--no-ignore_existing",
            "--profile.enable",
            "--work_dir.output",
            "w d",
            "--profile.steps",
            "1",
            "2",
            "--debug",
            "--set",
            "seed=3",
            "processes=2",
        ],
    ) == [
        *("--taggers", "a", "--taggers", "b", "-t", "c", "--documents", "x"),
        *("--experiment", "e", "--set", "ignore_existing=false"),
        *("--set", "profile.enable=true", "--set", 'work_dir.output="w d"'),
        *("--set", "profile.steps=[1, 2]", "--set", "debug=true"),
        *("--set", "seed=3", "--set", "processes=2"),
    ]


def test_values_keep_their_type(ds: Path) -> None:
    res = run(
        "dedupe",
        "--documents",
        "x/documents/*.gz",
        "--dedupe.documents.key",
        "$.metadata.url",
        "--dedupe.documents.attribute_name",
        "yes",
        "--dedupe.min_length",
        "3",
        "--dryrun",
    )
    assert res.exit_code == 0, res.output
    shown = yaml.safe_load(res.output)
    assert shown["dedupe"]["documents"] == {"key": "$.metadata.url", "attribute_name": "yes"}
    assert shown["dedupe"]["min_length"] == 3


def test_dryrun_tags_nothing(ds: Path) -> None:
    res = run("tag", "--documents", "ds/documents/*.gz", "--taggers", "a", "b", "--dryrun")
    assert res.exit_code == 0
    assert yaml.safe_load(res.output)["taggers"] == ["a", "b"]
    assert not (ds / "attributes").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("tag", "--documents", "ds/documents/*.gz", "--taggers", "a", "--experimnt", "x"),
        (
            "dedupe",
            "-d",
            "ds/documents/*.gz",
            "--dedupe.documents.attribute_name",
            "d",
            "--dedupe.min_lenght",
            "3",
        ),
    ],
    ids=["tag", "dedupe"],
)
def test_a_dry_run_refuses_a_misspelled_key(ds: Path, args: tuple[str, ...]) -> None:
    # dolma parses its config before printing it: a typo must not pass a dry run unnoticed
    res = run(*args, "--dryrun")
    assert res.exit_code != 0
    assert "did you mean" in res.output and args[-2].lstrip("-") in res.output


def test_what_lmdata_does_not_do_is_an_error(ds: Path) -> None:
    docs = f"{ds}/documents/*.jsonl.gz"
    r = run("-c", "configs/mix.yaml", "info", str(ds))
    assert r.exit_code == 2 and "-c CONFIG before the verb" in r.output
    r = run("-c", "configs/mix.yaml", "mix", "-c", "configs/mix.yaml")
    assert r.exit_code == 2 and "give -c CONFIG once" in r.output
    r = run("mix")
    assert r.exit_code == 2 and "mix needs a config" in r.output
    r = run("tag", "--documents", docs, "--taggers", "char_length_v1", "--destination", "o")
    assert r.exit_code == 2 and "destination" in r.output
    base = ["dedupe", "--documents", docs, "--dedupe.paragraphs.attribute_name", "p"]
    r = run(*base, "--bloom_filter.read_only")
    assert r.exit_code == 2 and "read_only needs bloom_filter.file" in r.output
    r = run(*base, "--dedupe.num_partitions", "4", "--dedupe.partition_index", "4")
    assert r.exit_code == 2 and "partition_index 4 is not below" in r.output
    r = run("tag", "--documents", docs, "--bogus")
    assert r.exit_code == 2 and "bogus" in r.output


def test_list_shows_the_taggers() -> None:
    res = run("list")
    assert res.exit_code == 0
    names = res.output.split()
    assert {"char_length_v1", "pii_regex_v2", "random_number_v1"} <= set(names)
    assert names == sorted(names)


def test_storage_options_reach_tag_dedupe_and_mix(
    ds: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--storage-option KEY=VALUE (dotted keys nest, JSON values parse) reaches the library
    call of every verb, and --dryrun never prints it (options may hold secrets)."""
    import lmdata.cli.dedupe
    import lmdata.cli.mix
    import lmdata.cli.tag

    seen: dict[str, object] = {}

    def fake(verb: str):
        def call(cfg, **kw):
            seen[verb] = kw.get("storage_options") or cfg.streams[0].storage_options
            raise SystemExit(0)

        return call

    monkeypatch.setattr(lmdata.cli.tag, "tag", fake("tag"))
    monkeypatch.setattr(lmdata.cli.dedupe, "dedupe", fake("dedupe"))
    monkeypatch.setattr(lmdata.cli.mix, "mix", fake("mix"))
    opts = ["--storage-option", "client_kwargs.endpoint_url=http://127.0.0.1:1"]
    opts += ["--storage-option", "anon=true", "--storage-option", "secret=s3cr3t"]
    want = {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"},
        "anon": True,
        "secret": "s3cr3t",
    }
    docs = f"{ds}/documents/*.jsonl.gz"
    assert run("tag", "-d", docs, "-t", "char_length_v1", *opts).exit_code == 0
    assert (
        run("dedupe", "-d", docs, "--dedupe.paragraphs.attribute_name", "p", *opts).exit_code == 0
    )
    assert run("-c", "configs/mix.yaml", "mix", *opts).exit_code == 0
    assert seen == {"tag": want, "dedupe": want, "mix": want}
    dry = run("dedupe", "-d", docs, "--dedupe.paragraphs.attribute_name", "p", "--dryrun", *opts)
    assert dry.exit_code == 0 and "s3cr3t" not in dry.output
    bad = run("tag", "-d", docs, "-t", "char_length_v1", "--storage-option", "novalue")
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output


def test_ngram_dedupe_command_line_from_dolma(tmp_path: Path, monkeypatch, caplog) -> None:
    """dolma's by_ngram and Bloom filter options on the command line: the attribute files of
    the committed dolma 1.2.1 fixture, and a line saying the filter settings are not used."""
    fixture = DATA / "ngram"
    shutil.copytree(fixture / "documents", tmp_path / "ds" / "documents")
    monkeypatch.chdir(tmp_path)
    res = run(
        "dedupe",
        "--documents",
        "ds/documents/*.jsonl.gz",
        "--dedupe.name",
        "n2s2",
        "--dedupe.paragraphs.attribute_name",
        "dup",
        "--dedupe.paragraphs.by_ngram.ngram_length",
        "2",
        "--dedupe.paragraphs.by_ngram.stride",
        "2",
        "--dedupe.paragraphs.by_ngram.overlap_threshold",
        "0.3",
        "--dedupe.skip_empty",
        "--bloom_filter.file",
        "bf.bin",
        "--no-bloom_filter.read_only",
        "--bloom_filter.estimated_doc_count",
        "10000",
        "--bloom_filter.desired_false_positive_rate",
        "1e-9",
        "-q",
    )
    assert res.exit_code == 0, res.output
    assert "sizing settings accepted and not used" in caplog.text
    for part in ("part-0.jsonl.gz", "part-1.jsonl.gz"):
        got = _raw(tmp_path / "ds" / "attributes" / "n2s2" / part)
        assert got == _raw(fixture / "attributes" / "n2s2" / part)
    assert (tmp_path / "bf.bin").read_bytes()[:8] == b"LMDKEYS1"  # lmdata's key file


@pytest.mark.parametrize("verb", ["dedupe", "decontaminate"])
def test_ctrl_c_in_a_resumable_job_exits_130_with_the_command_that_continues_it(
    tmp_path, monkeypatch, verb
):
    import lmdata.cli.dedupe
    import lmdata.dolma.decontam

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    where = {"dedupe": lmdata.cli.dedupe, "decontaminate": lmdata.dolma.decontam}[verb]
    monkeypatch.setattr(where, verb, interrupted)
    doc = tmp_path / "d.jsonl"
    doc.write_text('{"id": "a", "text": "x"}\n')
    args = {
        "dedupe": [
            *("dedupe", "--documents", str(doc), "--dedupe.name", "d"),
            *("--dedupe.documents.key", "$.id", "--dedupe.documents.attribute_name", "dup"),
        ],
        "decontaminate": ["decontaminate", "--documents", str(doc), "--against", str(doc)],
    }[verb]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 130, res.output
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("interrupted: continue with: ") and line.endswith("--resume"), line
