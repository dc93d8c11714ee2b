"""dolma verbs lmdata does not provide: a clear error naming the alternative, not "No such
command", with dolma's own arguments and ``-c CONFIG`` as users pass them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli


@pytest.mark.parametrize(
    "argv, alternative",
    [
        (["stat", "--attributes", "ds/attributes/x/*.gz", "--report", "out.json"], "lmdata stats"),
        (["warc", "--documents", "cc/*.warc.gz", "--destination", "out"], "lmdata tag"),
        (["tokens", "--documents", "d/*.gz", "--tokenizer.name_or_path", "x"], "lmdata tokenize"),
    ],
)
def test_dolma_verbs_lmdata_lacks_name_the_alternative(argv: list[str], alternative: str) -> None:
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 2
    assert f"`dolma {argv[0]}`" in res.output and alternative in res.output, res.output


def test_config_before_the_verb_still_gets_that_error(tmp_path: Path) -> None:
    cfg = tmp_path / "stat.yaml"
    cfg.write_text("attributes: []\n")
    res = CliRunner().invoke(cli, ["-c", str(cfg), "stat"])
    assert res.exit_code == 2 and "lmdata stats" in res.output, res.output


def test_help_lists_only_real_verbs() -> None:
    res = CliRunner().invoke(cli, ["--help"])
    listed = [line.split()[0] for line in res.output.split("Commands:")[1].splitlines() if line]
    assert "stats" in listed and not {"stat", "warc", "tokens"} & set(listed)
    assert "No such command" in CliRunner().invoke(cli, ["nosuch"]).output
    assert "lmdata stats" in CliRunner().invoke(cli, ["stat", "--help"]).output
