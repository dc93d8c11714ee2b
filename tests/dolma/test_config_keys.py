"""Unknown config keys are refused at every nesting level, naming the key's path and the
closest accepted key, as dolma 1.2.1 refuses them (a misspelled ``dedupe.min_lenght`` must not
run with ``min_length`` 0); every key dolma 1.2.1 accepts is still accepted."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from lmdata.dolma.config import (
    DedupeConfig,
    MixerConfig,
    TagConfig,
    apply_overrides,
    load_config,
    load_yaml,
)
from lmdata.errors import InvalidInputError
from tests.dolma.test_dedupe import _docs, dedupe_cli

DATA = Path(__file__).parent.parent / "data" / "dolma"

# every key of dolma 1.2.1's config dataclasses (dolma/cli/{deduper,mixer,tagger,shared}.py),
# written out here rather than taken from lmdata's own tables, so that a key dropped there fails
DEDUPE_FULL: dict[str, Any] = {
    "documents": ["ds/documents/*.jsonl.gz"],
    "work_dir": {"input": "wi", "output": "wo"},
    "dedupe": {
        "name": "dedupe_paragraphs",
        "paragraphs": {
            "attribute_name": "bff_duplicate_paragraph_spans",
            "paragraph_separator": "\n",
            "by_ngram": {
                "ngram_length": 5,
                "stride": 1,
                "overlap_threshold": 0.5,
                "skip_short_paragraphs": True,
            },
        },
        "skip_empty": True,
        "min_length": 3,
        "min_words": 2,
        "num_partitions": 2,
        "partition_index": 1,
        "file_partition": False,
        "document_dir": "documents",
    },
    "bloom_filter": {
        "file": "bf.bin",
        "read_only": False,
        "size_in_bytes": 0,
        "estimated_doc_count": 1000,
        "desired_false_positive_rate": 0.0001,
    },
    "processes": 1,
    "compression": {"input": None, "output": None},
    "dryrun": False,
    "is_s3_volume": False,
}
DEDUPE_DOCS: dict[str, Any] = {
    "documents": ["ds/documents/*.jsonl.gz"],
    "dedupe": {
        "name": "dedupe_docs",
        "documents": {"attribute_name": "bff_duplicate_url", "key": "$.metadata.url"},
    },
}
STREAM: dict[str, Any] = {
    "name": "s",
    "documents": ["ds/documents/*.gz"],
    "attributes": ["exp"],
    "filter": {"include": ["$.a"], "exclude": ["$.b"], "syntax": "jsonpath"},
    "span_replacement": [
        {
            "span": "$.attributes.x",
            "min_score": 0.5,
            "max_score": 2,
            "replacement": "",
            "syntax": "jsonpath",
        }
    ],
    "output": {
        "path": "out",
        "max_size_in_bytes": 1000,
        "discard_fields": ["attributes"],
        "min_text_length": 1,
    },
    "compression": {"input": None, "output": "gz"},
}
MIX_FULL: dict[str, Any] = {
    "streams": [STREAM, {**copy.deepcopy(STREAM), "name": "t"}],
    "work_dir": {"input": "wi", "output": "wo"},
    "processes": 1,
    "shuffle": True,
    "dryrun": False,
}
TAG_FULL: dict[str, Any] = {
    "documents": ["ds/documents/*.gz"],
    "destination": None,
    "tagger_modules": [],
    "taggers": ["char_length_v1"],
    "experiment": "exp",
    "processes": 1,
    "ignore_existing": False,
    "debug": False,
    "profile": {
        "enable": False,
        "output": None,
        "steps": None,
        "sort_key": "tottime",
        "lines": 100,
    },
    "work_dir": {"input": None, "output": None},
    "dryrun": False,
}


def test_every_dolma_key_is_accepted() -> None:
    cfg = DedupeConfig.from_dict(DEDUPE_FULL)
    assert (cfg.min_length, cfg.min_words, cfg.skip_empty, cfg.partition_index) == (3, 2, True, 1)
    assert cfg.ngrams.length == 5 and cfg.bloom_filter.file == "bf.bin"
    assert DedupeConfig.from_dict(DEDUPE_DOCS).key == "$.metadata.url"
    mix = MixerConfig.from_dict(MIX_FULL)
    assert [s.name for s in mix.streams] == ["s", "t"]
    assert mix.streams[0].max_size_in_bytes == 1000
    assert TagConfig.from_dict(TAG_FULL).experiment == "exp"
    # lmdata's own keys
    opts = {"storage_options": {"anon": True}}
    assert DedupeConfig.from_dict({**DEDUPE_FULL, **opts}).storage_options == {"anon": True}
    assert MixerConfig.from_dict({**MIX_FULL, **opts}).streams[0].storage_options == {"anon": True}
    assert TagConfig.from_dict({**TAG_FULL, **opts, "seed": 3, "compression": "zst"}).seed == 3
    later = {"sysram_limit": 1e9, "save_to_disk": False}  # later dolma versions' bloom keys
    assert not DedupeConfig.from_dict(
        apply_overrides(DEDUPE_FULL, {f"bloom_filter.{k}": v for k, v in later.items()})
    ).bloom_filter.save


def test_fixture_configs_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture mix config and the dedupe command line of tests/data/dolma/dolma121_cli
    (both run by dolma 1.2.1) parse with every key."""
    monkeypatch.chdir(DATA)
    cfg = MixerConfig.from_dict(load_config(DATA / "configs" / "mix.yaml"))
    (s,) = cfg.streams
    assert (s.max_size_in_bytes, s.min_text_length, s.discard_fields) == (5000, 1, ("attributes",))
    assert len(s.span_replacement) == 2 and len(s.exclude) == 2
    readme = (DATA / "dolma121_cli" / "README.md").read_text()
    flags = re.findall(r"--([a-z_.]+)\s+([^\s`-][^\s`]*)", readme.split("`dedupe_paragraphs")[1])
    assert len(flags) == 7, flags
    data = apply_overrides(
        {"bloom_filter": {"read_only": False}},
        {k: load_yaml(v) for k, v in flags if k not in ("processes", "documents")},
    )
    got = DedupeConfig.from_dict({**data, "documents": ["dataset/documents/*.jsonl.gz"]})
    assert got.name == "dedupe_paragraphs" and got.bloom_filter.file == "bf.bin"


def _set(base: dict[str, Any], path: list[Any], key: str, value: Any = 1) -> dict[str, Any]:
    out = copy.deepcopy(base)
    node: Any = out
    for p in path:
        node = node[p]
    node[key] = value
    return out


def _refused(what: str, path: list[Any], bad: str, fix: str) -> str:
    """The message's regex: the unknown key's path (``a.b[0].c``) and the suggestion."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in [*path, bad])
    where = where.lstrip(".")
    return rf"{what} config: unknown key {re.escape(where)} \(did you mean {re.escape(fix)}\?\)"


DEDUPE_CASES = [
    ([], "procesess", "processes"),
    ([], "bloomfilter", "bloom_filter"),
    (["dedupe"], "min_lenght", "dedupe.min_length"),
    (["dedupe"], "partition_idx", "dedupe.partition_index"),
    (["dedupe", "paragraphs"], "paragraph_seperator", "dedupe.paragraphs.paragraph_separator"),
    (
        ["dedupe", "paragraphs", "by_ngram"],
        "ngram_lenght",
        "dedupe.paragraphs.by_ngram.ngram_length",
    ),
    (["bloom_filter"], "read_onyl", "bloom_filter.read_only"),
    (["work_dir"], "outptu", "work_dir.output"),
    (["compression"], "ouput", "compression.output"),
]


@pytest.mark.parametrize(("path", "bad", "fix"), DEDUPE_CASES)
def test_dedupe_misspelled_key_is_refused(path: list[str], bad: str, fix: str) -> None:
    with pytest.raises(InvalidInputError, match=_refused("dedupe", path, bad, fix)):
        DedupeConfig.from_dict(_set(DEDUPE_FULL, path, bad))


def test_dedupe_documents_mode_keys_are_checked() -> None:
    with pytest.raises(
        InvalidInputError,
        match=r"dedupe\.documents\.keys \(did you mean dedupe\.documents\.key\?\)",
    ):
        DedupeConfig.from_dict(_set(DEDUPE_DOCS, ["dedupe", "documents"], "keys", "$.id"))
    # paragraph-only keys do not belong to document dedupe
    with pytest.raises(InvalidInputError, match=r"unknown key dedupe\.documents\.by_ngram"):
        DedupeConfig.from_dict(_set(DEDUPE_DOCS, ["dedupe", "documents"], "by_ngram", {}))


MIX_CASES = [
    ([], "shufle", "shuffle"),
    (["work_dir"], "inptu", "work_dir.input"),
    (["streams", 0], "atributes", "streams[0].attributes"),
    (["streams", 1], "span_replacements", "streams[1].span_replacement"),
    (["streams", 0, "output"], "max_size_in_byte", "streams[0].output.max_size_in_bytes"),
    (["streams", 0, "filter"], "exlude", "streams[0].filter.exclude"),
    (["streams", 1, "span_replacement", 0], "min_scor", "streams[1].span_replacement[0].min_score"),
    (["streams", 0, "compression"], "outptu", "streams[0].compression.output"),
]


@pytest.mark.parametrize(("path", "bad", "fix"), MIX_CASES)
def test_mix_misspelled_key_is_refused(path: list[Any], bad: str, fix: str) -> None:
    with pytest.raises(InvalidInputError, match=_refused("mix", path, bad, fix)):
        MixerConfig.from_dict(_set(MIX_FULL, path, bad))


@pytest.mark.parametrize(
    ("path", "bad", "fix"),
    [
        ([], "tagers", "taggers"),
        (["profile"], "enabel", "profile.enable"),
        (["work_dir"], "ouptut", "work_dir.output"),
    ],
)
def test_tag_misspelled_key_is_refused(path: list[str], bad: str, fix: str) -> None:
    with pytest.raises(InvalidInputError, match=_refused("tag", path, bad, fix)):
        TagConfig.from_dict(_set(TAG_FULL, path, bad))


def test_every_unknown_key_is_named_and_far_ones_get_no_guess() -> None:
    bad = _set(_set(DEDUPE_FULL, [], "zzz"), ["dedupe"], "min_lenght")
    with pytest.raises(InvalidInputError) as e:
        DedupeConfig.from_dict(bad)
    msg = str(e.value)
    assert "unknown keys " in msg and "dedupe.min_lenght (did you mean dedupe.min_length?)" in msg
    assert re.search(r"\bzzz(;|:)", msg), msg  # named, with no suggestion
    assert "did you mean zzz" not in msg and "fix or remove" in msg


@pytest.mark.parametrize("cls", [DedupeConfig, MixerConfig, TagConfig])
def test_a_config_that_is_not_a_mapping_is_refused(cls: Any) -> None:
    with pytest.raises(
        InvalidInputError, match="config must be a mapping of keys to values, got list"
    ):
        cls.from_dict([{"documents": ["x"]}])


def test_command_line_misspelling_is_refused(tmp_path: Path) -> None:
    """``lmdata dedupe --dedupe.min_lenght 3`` (a dolma-style flag) fails before any work: on
    documents that the same command line without the typo dedupes."""
    root = _docs(tmp_path)
    flags = ("--dedupe.paragraphs.attribute_name", "p", "--dedupe.name", "p")
    res = dedupe_cli(root, *flags, "--dedupe.min_lenght", "3")
    assert res.exit_code != 0
    assert "dedupe.min_lenght (did you mean dedupe.min_length?)" in res.output, res.output
    assert not (root / "attributes").exists()
    res = dedupe_cli(root, *flags, "--dedupe.min_length", "3", "-q")
    assert res.exit_code == 0, res.output
    assert (root / "attributes" / "p").is_dir()


def test_set_reaches_into_lists_by_index_and_refuses_names_through_a_list():
    # `mix --set streams.0.output.path=...` replaced the whole streams list with a mapping
    data = {"streams": [{"name": "a", "output": {"path": "o"}}, {"name": "b"}], "processes": 1}
    out = apply_overrides(data, {"streams.1.output.path": "p", "processes": 2})
    assert out["streams"][0] == data["streams"][0]
    assert out["streams"][1] == {"name": "b", "output": {"path": "p"}}
    assert out["processes"] == 2 and data["processes"] == 1  # a copy
    for key in ("streams.output", "streams.2.name", "streams.-1.name"):
        with pytest.raises(InvalidInputError, match="list of 2"):
            apply_overrides(data, {key: "x"})
