"""``lmdata modalities data ...``: modalities' commands and pack config, checked against the
reference files modalities 0.5.0 wrote (tests/data/modalities)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lmdata.cli.main import cli

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
        ({"settings__jq_pattern": ".meta | .text"}, "jq_pattern"),
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
