"""``lmdata modalities data ...``: modalities' commands and pack config, checked against the
reference files modalities 0.5.0 wrote (tests/data/modalities)."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
import sys
from pathlib import Path

import jq
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lmdata.cli.main import cli
from lmdata.compat.modalities import TextOf
from lmdata.errors import MissingDependencyError
from tests.compat.modalities_reference import JQ_PROGRAM, LINES

MOD = Path(__file__).parents[1] / "data" / "modalities"

CONFIG = {
    "settings": {
        "src_path": "data/docs.jsonl",
        "dst_path": "data/docs.pbin",
        "index_path": "data/docs.idx",
        "jq_pattern": ".text",
        "num_cpus": "${node_env:num_cpus}",
        "eod_token": "<|endoftext|>",
        "processing_batch_size": 10,
        "raw_samples_queue_size": 300,
        "processed_samples_queue_size": 300,
    },
    "tokenizer": {
        "component_key": "tokenizer",
        "variant_key": "pretrained_hf_tokenizer",
        "config": {
            "pretrained_model_name_or_path": "data/tokenizers/bpe5k",
            "padding": False,
            "truncation": False,
            "special_tokens": {"pad_token": "<|endoftext|>"},
        },
    },
}


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "data").mkdir()
    shutil.copy(MOD / "docs.jsonl", tmp_path / "data" / "docs.jsonl")
    shutil.copytree(MOD / "tokenizers", tmp_path / "data" / "tokenizers")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _config(path: str = "pack.yaml", **changes: object) -> str:
    cfg = yaml.safe_load(yaml.safe_dump(CONFIG))
    for dotted, value in changes.items():
        node = cfg
        *parents, last = dotted.split("__")
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    Path(path).write_text(yaml.safe_dump(cfg))
    return path


def test_index_then_pack_are_byte_identical(work: Path) -> None:
    res = run("modalities", "data", "create_raw_index", "--index_path", "data/docs.idx",
              "data/docs.jsonl")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert Path("data/docs.idx").read_bytes() == (MOD / "docs.idx").read_bytes()
    res = run("modalities", "data", "pack_encoded_data", _config())
    assert res.exit_code == 0, res.output
    assert Path("data/docs.pbin").read_bytes() == (MOD / "docs_bpe5k.pbin").read_bytes()
    assert not list(Path("data").glob("*lmdata-manifest"))  # the origin's file set, no more


def test_defaults_and_existence_policies(work: Path) -> None:
    assert run("modalities", "data", "create_raw_index", "data/docs.jsonl").exit_code == 0
    again = run("modalities", "data", "create_raw_index", "data/docs.jsonl")
    assert again.exit_code == 2 and "already exists" in again.output
    Path("data/docs.idx").write_bytes(b"stale")
    skip = run("modalities", "data", "create_raw_index", "--file_existence_policy", "skip",
               "data/docs.jsonl")  # fmt: skip
    assert skip.exit_code == 0 and Path("data/docs.idx").read_bytes() == b"stale"
    over = run("modalities", "data", "create_raw_index", "--file_existence_policy", "override",
               "data/docs.jsonl")  # fmt: skip
    assert over.exit_code == 0
    assert Path("data/docs.idx").read_bytes() == (MOD / "docs.idx").read_bytes()
    # dst_path and index_path default to the source's stem, as in modalities
    cfg = _config(settings__dst_path=None, settings__index_path=None, settings__num_cpus=1)
    assert run("modalities", "data", "pack_encoded_data", cfg).exit_code == 0
    assert Path("data/docs.pbin").read_bytes() == (MOD / "docs_bpe5k.pbin").read_bytes()
    res = run("modalities", "data", "pack_encoded_data", cfg)
    assert res.exit_code == 2 and "already exists" in res.output


@pytest.mark.parametrize(
    "change, message",
    [
        ({"settings__shuffle": True}, "unknown config key settings.shuffle"),
        ({"tokenizer__config__add_prefix_space": True}, "tokenizer.config.add_prefix_space"),
        ({"settings__jq_pattern": ".text | [["}, "not a valid jq program"),
        ({"settings__jq_pattern": ".meta | .text"}, "'.meta | .text' gives null, not a string"),
        ({"settings__jq_pattern": ".meta.n"}, "gives null"),
        ({"settings__jq_pattern": ".text | length"}, "gives a number"),
        ({"settings__jq_pattern": "[.text]"}, "gives an array"),
        ({"settings__jq_pattern": "{t: .text}"}, "gives an object"),
        ({"settings__jq_pattern": '.text == ""'}, "gives a boolean"),
        ({"settings__jq_pattern": ".text[]"}, "fails: Cannot iterate over string"),
        ({"settings__jq_pattern": "empty"}, "gives no result"),
        ({"settings__eod_token": None}, "settings.eod_token is required"),
        ({"settings__processing_batch_size": 0}, "processing_batch_size must be an integer"),
        ({"tokenizer__config__truncation": True}, "truncation"),
        ({"tokenizer__config__pretrained_model_name_or_path": "gpt2"}, "never downloads"),
        ({"tokenizer__config__special_tokens": {"pad_token": "<pad>"}}, "'<pad>'"),
        ({"tokenizer__variant_key": "pretrained_xyz"}, "pretrained_xyz"),
    ],
)
def test_what_lmdata_does_not_implement_is_named(
    work: Path, change: dict[str, object], message: str
) -> None:
    assert run("modalities", "data", "create_raw_index", "data/docs.jsonl").exit_code == 0
    res = run("modalities", "data", "pack_encoded_data", _config(**change))
    assert res.exit_code == 2 and message in res.output, res.output
    assert not Path("data/docs.pbin").exists()


def test_pack_needs_the_index(work: Path) -> None:
    res = run("modalities", "data", "pack_encoded_data", _config())
    assert res.exit_code == 2 and "create_raw_index" in res.output


def _docs_of(pbin: bytes) -> list[bytes]:
    """The token bytes of each document of a .pbin, in order (its index read as modalities
    writes it: a pickled list of (offset, length) pairs of ints)."""
    data_len, _ = struct.unpack("<QI", pbin[:12])
    index = pickle.loads(pbin[12 + data_len :])  # our own reference file
    return [pbin[12 + o : 12 + o + n] for o, n in index]


def test_pack_reads_the_documents_the_index_lists(work: Path) -> None:
    """An index that skips, repeats and reorders lines packs those documents in its order,
    byte for byte as modalities 0.5.0 packed them (tests/compat/modalities_reference.py)."""
    shutil.copy(MOD / "docs_reordered.idx", "data/docs.idx")
    res = run("modalities", "data", "pack_encoded_data", _config())
    assert res.exit_code == 0, res.output
    got = Path("data/docs.pbin").read_bytes()
    assert got == (MOD / "docs_reordered_bpe5k.pbin").read_bytes()
    # the same as modalities' own rule says: the documents of the full pack, in index order
    full = _docs_of((MOD / "docs_bpe5k.pbin").read_bytes())
    assert _docs_of(got) == [full[i] for i in LINES]
    assert not list(Path("data").glob(".*"))  # no staged texts or work folder left behind


def test_pack_runs_a_jq_program(work: Path) -> None:
    shutil.copy(MOD / "docs_reordered.idx", "data/other.idx")
    cfg = _config(settings__jq_pattern=JQ_PROGRAM, settings__index_path="data/other.idx")
    res = run("modalities", "data", "pack_encoded_data", cfg)
    assert res.exit_code == 0, res.output
    got = Path("data/docs.pbin").read_bytes()
    assert got == (MOD / "docs_reordered_jq_bpe5k.pbin").read_bytes()
    plain = (MOD / "docs_reordered_bpe5k.pbin").read_bytes()
    changed = [a != b for a, b in zip(_docs_of(got), _docs_of(plain), strict=True)]
    lines = (MOD / "docs.jsonl").read_bytes().split(b"\n")
    has_meta = [bool(json.loads(lines[i]).get("meta")) for i in LINES]
    assert changed == has_meta and any(has_meta) and not all(has_meta)


def test_pack_error_names_the_document(work: Path) -> None:
    assert run("modalities", "data", "create_raw_index", "data/docs.jsonl").exit_code == 0
    res = run("modalities", "data", "pack_encoded_data", _config(settings__jq_pattern=".meta.n"))
    assert res.exit_code == 2
    assert "docs.jsonl" in res.output and "index entry 0 (byte 0)" in res.output, res.output


def test_jq_is_an_extra_key_paths_need_none(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the jq package a key path still packs byte for byte; a jq program is an error
    naming the extra that installs jq (before any output is written)."""
    monkeypatch.setitem(sys.modules, "jq", None)  # import jq -> ModuleNotFoundError
    shutil.copy(MOD / "docs_reordered.idx", "data/docs.idx")
    res = run("modalities", "data", "pack_encoded_data", _config())
    assert res.exit_code == 0, res.output
    assert Path("data/docs.pbin").read_bytes() == (MOD / "docs_reordered_bpe5k.pbin").read_bytes()
    assert TextOf(".meta.n")(b'{"meta": null}') is None
    with pytest.raises(ValueError, match="Cannot index array"):
        TextOf(".meta.n")(b'{"meta": [1]}')
    with pytest.raises(ValueError):
        TextOf(".text")(b'{"text": "x"')  # not JSON: jq fails too
    with pytest.raises(MissingDependencyError, match=r"pip install 'lmdata\[jq\]'"):
        TextOf(JQ_PROGRAM)
    cfg = _config("jq.yaml", settings__jq_pattern=JQ_PROGRAM, settings__dst_path="x.pbin")
    res = run("modalities", "data", "pack_encoded_data", cfg)
    assert res.exit_code != 0 and "pip install 'lmdata[jq]'" in res.output, res.output
    assert "jq_pattern" in res.output and not Path("x.pbin").exists()


# JSON has no NaN or Infinity (json.dumps writes them; jq reads Infinity as the largest float)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from("ab"), kids),
    max_leaves=8,
)


def _jq_first(pattern: str, raw: bytes) -> object:
    try:
        return ("ok", jq.compile(pattern).input_text(raw.decode()).first())
    except (ValueError, StopIteration) as e:
        return ("error", type(e).__name__)


@settings(max_examples=200, deadline=None)
@given(doc=_json, pattern=st.sampled_from([".a", ".a.b", ".b.a.a", ".a.a"]))
@example(doc={"a": 2**53 + 1}, pattern=".a")  # jq holds numbers as doubles
@example(doc={"a": [-(2**64) - 1, {"b": 10**400}]}, pattern=".a")
def test_key_paths_read_directly_give_what_jq_gives(doc: object, pattern: str) -> None:
    raw = json.dumps(doc).encode()
    try:
        got: object = ("ok", TextOf(pattern)(raw))
    except (ValueError, StopIteration) as e:
        got = ("error", type(e).__name__)
    assert got == _jq_first(pattern, raw)
    assert TextOf(pattern).keys == pattern[1:].split(".")
