"""A mix rule that could not have done anything is named in one warning line: a filter on an
attribute no document has (with the names that exist, closest first), include filters that
matched nothing; ``--strict`` makes it an error. The output stays what dolma writes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.dolma import mixer
from lmdata.dolma.config import MixerConfig, load_config
from lmdata.dolma.mixing import ShardStats
from lmdata.dolma.pieces import mark_done, part_key
from lmdata.errors import InvalidInputError
from lmdata.storage import resolve
from tests.dolma.test_mixer import _copy, _rows, _stream, _tree

TYPO = "exp__char_length_v1__document"  # the real name ends in __length
RIGHT = "exp__char_length_v1__length"


def _config(root: Path, include: str | None = None, exclude: str | None = None, **kw) -> dict:
    """The fixture's config with one filter replaced (and its output in its own folder)."""
    cfg = load_config(str(root / "configs" / "mix.yaml"))
    s = cfg["streams"][0]
    if include is not None:
        s["filter"]["include"] = [include]
    if exclude is not None:
        s["filter"]["exclude"] = [exclude]
    s["output"]["path"] = str(root / kw.pop("out", "mixed"))
    cfg.update(kw)
    return cfg


def _mix(root: Path, cfg: dict, **kw) -> mixer.MixResult:
    return mixer.mix(MixerConfig.from_dict(cfg), base=root, **kw)


def _docs(res: mixer.MixResult) -> list[dict]:
    return [d for o in res.outputs for d in _rows(Path(o))]


def test_an_include_on_a_misspelt_attribute_says_so(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    res = _mix(root, _config(root, include=f"$.attributes[?(@.{TYPO}[0][2] >= 25)]"))
    assert (res.written, res.filtered) == (0, res.read) and res.read > 0  # as dolma does
    (line,) = res.warnings  # one line, not a second "matched none" line as well
    assert "\n" not in line
    assert f"attribute {TYPO!r}" in line and f"$.attributes[?(@.{TYPO}[0][2] >= 25)]" in line
    assert f"did you mean {RIGHT!r}?" in line
    assert "attributes present: " + RIGHT in line  # the closest first
    assert f"none of the {res.read:,} documents read has" in line
    assert "so this include matches no document" in line


def test_an_exclude_on_a_misspelt_attribute_keeps_dolmas_output(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    right = _mix(root, _config(root, exclude=f"$.attributes[?(@.{RIGHT}[0][2] < -1)]", out="a"))
    typo = _mix(root, _config(root, exclude=f"$.attributes[?(@.{TYPO}[0][2] < 25)]", out="b"))
    assert right.warnings == ()  # a correct filter that removes nothing is no news
    assert _docs(typo) == _docs(right)  # the exclude never fires, as in dolma
    (line,) = typo.warnings
    assert f"did you mean {RIGHT!r}?" in line and "so this exclude removes no document" in line


def test_the_fixture_config_gives_no_warning(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    assert _mix(root, _config(root)).warnings == ()


def test_include_filters_that_match_nothing(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    res = _mix(root, _config(root, include=f"$.attributes[?(@.{RIGHT}[0][2] > 1e12)]"))
    assert res.written == 0
    assert res.warnings == (
        f"stream 'fixture-mix': the include filters matched none of the {res.read:,} "
        "documents read, so none was written",
    )


def test_strict_makes_it_an_error(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    cfg = _config(root, include=f"$.attributes[?(@.{TYPO}[0][2] >= 25)]")
    with pytest.raises(InvalidInputError, match=f"did you mean {RIGHT!r}"):
        _mix(root, cfg, strict=True)
    _mix(root, _config(root, out="ok"), strict=True)  # nothing to say: no error


def test_no_attribute_sets_at_all(tmp_path: Path) -> None:
    root = _tree(tmp_path, [{"id": "1", "text": "x"}], {})
    cfg = {"streams": [_stream(root, filter={"syntax": "jq", "exclude": [".attributes.k > 1"]})]}
    (line,) = mixer.mix(MixerConfig.from_dict(cfg)).warnings
    assert "reads attribute 'k'" in line and "no document read has any attribute" in line


@pytest.mark.parametrize("engine", ["processes", "inprocess"])
def test_names_are_gathered_by_every_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """Shards in pieces on worker processes: the names each unit saw reach the driver."""
    root = _copy(tmp_path)
    monkeypatch.setattr(mixer, "PIECE_BYTES", 1)  # a piece per input file
    cfg = _config(root, include=f"$.attributes[?(@.{TYPO}[0][2] >= 25)]", processes=2)
    cfg["streams"][0]["output"]["max_size_in_bytes"] = 10**9  # one shard of two pieces
    cfg["streams"][0]["span_replacement"][1]["span"] = (
        "$.attributes.pii_regex__pii_regex_v1__EMAIL_ADDRESS"
    )
    res = _mix(root, cfg, engine=engine)
    assert len(res.warnings) == 2, res.warnings
    assert "did you mean 'pii_regex__pii_regex_v2__EMAIL_ADDRESS'?" in res.warnings[1]
    assert "so this rule replaces no span" in res.warnings[1]


def test_a_resumed_piece_keeps_the_names_it_saw(tmp_path: Path) -> None:
    """A piece an earlier run completed is not mixed again: its marker holds its names."""
    root = _copy(tmp_path)
    cfg = MixerConfig.from_dict(_config(root))
    stream = dataclasses.replace(cfg.streams[0], max_size_in_bytes=10**9)
    (shard,) = mixer.plan_shards(stream, root)
    shard = dataclasses.replace(shard, cuts=(0, 1), job="j")
    store, key = resolve(shard.output)
    done = ShardStats(read=3, not_included=1, attributes=("a", "b"), checksum=(1, 2))
    piece = Path(part_key(key, 0, "j"))  # the piece, then its marker
    piece.parent.mkdir(parents=True)
    piece.write_bytes(b"")
    mark_done(store, key, 0, "j", dataclasses.asdict(done))
    (got,) = mixer._done([shard])
    assert got[0] == done


def test_cli_warns_in_one_line_and_strict_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy(tmp_path)
    monkeypatch.chdir(root)
    cfg = load_config("configs/mix.yaml")
    cfg["streams"][0]["filter"]["include"] = [f"$.attributes[?(@.{TYPO}[0][2] >= 25)]"]
    Path("typo.json").write_text(json.dumps(cfg))
    res = CliRunner().invoke(cli, ["mix", "-c", "typo.json", "-q"])
    assert res.exit_code == 0, res.output
    warned = [x for x in res.stderr.splitlines() if x.startswith("warning: ")]
    assert len(warned) == 1 and f"did you mean {RIGHT!r}?" in warned[0]
    assert "wrote 0 (" in res.stdout
    cfg["streams"][0]["output"]["path"] = "strict"  # not the shards written above (kept)
    Path("typo.json").write_text(json.dumps(cfg))
    strict = CliRunner().invoke(cli, ["mix", "-c", "typo.json", "-q", "--strict"])
    assert strict.exit_code == 2
    assert strict.stderr.strip().splitlines()[-1].startswith("error: ")
    assert f"did you mean {RIGHT!r}?" in strict.stderr


def test_attribute_names_of_expressions() -> None:
    from lmdata.dolma.jsonpath import attribute_names

    cases = {
        "$.attributes[?(@.a[0][2] < 0.9)]": ("a",),
        "$.attributes[?(@.a && @.a[0] && (@['b c'][0][2] > 0.5 || !@.d))]": ("a", "b c", "d"),
        "$.attributes[?(@.a[?(@.inner > 1)])]": ("a",),  # a nested filter's @ is another node
        "$.attributes.spans": ("spans",),
        "$['attributes']['x']": ("x",),
        "$.attributes.*": (),
        "$.metadata[?(@.a)]": (),
    }
    for expr, names in cases.items():
        assert attribute_names(expr) == names, expr
    assert attribute_names('.attributes.a[0][2] > 1 and .attributes["b-c"]', "jq") == ("a", "b-c")


def test_a_rule_name_seen_after_many_others_is_not_called_absent(tmp_path: Path) -> None:
    """The names a unit gathers are capped (MAX_NAMES) for the did-you-mean; the names the
    rules read that did show up must be kept whatever the cap, or a filter that worked is
    reported as reading nothing (and --strict fails a correct job)."""
    from lmdata.dolma._unmatched import MAX_NAMES

    from .test_mixer import _stream as stream
    from .test_mixer import _tree as tree

    many = {f"other_{i:05d}": [[0, 1, 1.0]] for i in range(MAX_NAMES + 5)}
    docs = [{"id": "1", "text": "first"}, {"id": "2", "text": "second"}]
    attrs = [
        {"id": "1", "attributes": many},  # fills the gathered names first
        {"id": "2", "attributes": {"k": [[0, 6, 0.1]]}},  # then the name the rule reads
    ]
    root = tree(tmp_path, docs, {"a": attrs})
    ex = {"exclude": ["$.attributes[?(@.k[0][2] < 0.5)]"]}
    cfg = {"streams": [stream(root, attributes=["a"], filter=ex)]}
    res = mixer.mix(MixerConfig.from_dict(cfg), strict=True)
    assert (res.read, res.written, res.filtered) == (2, 1, 1)  # the exclude did remove one
    assert res.warnings == ()
