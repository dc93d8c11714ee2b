"""Optional dependencies: every one is an extra, and a missing one names the extra to install."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lmdata
from lmdata import _deps
from lmdata.errors import FormatError, MissingDependencyError

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def test_every_optional_module_has_a_declared_extra_and_all_has_them_all():
    all_extras = EXTRAS["all"][0].split("[", 1)[1].rstrip("]").split(",")
    for module, (extra, package) in _deps.EXTRAS.items():
        assert extra in EXTRAS, module
        assert any(req.startswith(package) for req in EXTRAS[extra]), (module, EXTRAS[extra])
        assert extra in all_extras, extra
    assert set(all_extras) == set(EXTRAS) - {"all", "dev"}


def test_require_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # import gcsfs -> ModuleNotFoundError
    with pytest.raises(MissingDependencyError, match=r"pip install 'lmdata\[gcs\]'") as ei:
        _deps.require("gcsfs", "reading gs:// paths")
    assert "reading gs:// paths needs the package 'gcsfs'" in str(ei.value)
    assert isinstance(ei.value, ImportError)
    assert _deps.install_hint("some_module") == "pip install some-module"


def _sharded_store(path: Path) -> Path:
    zarr = pytest.importorskip("zarr")
    enc = np.array([3, 4, 7, 8, 10, 13, 14, 16], np.uint32)
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    s = g.create_group("train")
    a = s.create_array("encoded_tokens", shape=(8,), chunks=(2,), shards=(4,), dtype="uint32")
    a[:] = enc
    b = s.create_array("seq_starts", shape=(4,), chunks=(2,), shards=(4,), dtype="uint64")
    b[:] = np.array([0, 2, 5, 8], np.uint64)
    s.attrs["max_token_id"] = 8
    return path


def test_sharded_zarr_without_crc32c_names_the_extra(tmp_path, monkeypatch):
    p = _sharded_store(tmp_path / "z.zarr")
    meta = json.loads((p / "train" / "encoded_tokens" / "zarr.json").read_text())
    index_codecs = meta["codecs"][0]["configuration"]["index_codecs"]
    assert any(c["name"] == "crc32c" for c in index_codecs)  # zarr's default
    assert [x.tolist() for x in lmdata.open(p)] == [[1, 2], [3, 4, 5], [6, 7, 8]]
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'lmdata\[crc32c\]'"):
        lmdata.open(p)
    from lmdata.cli.main import cli

    res = CliRunner().invoke(cli, ["info", str(p)])
    assert res.exit_code != 0
    assert "lmdata[crc32c]" in res.output and "a bug in lmdata" not in res.output


def test_registry_names_the_extra_of_a_missing_module(tmp_path, monkeypatch):
    from lmdata import formats

    (tmp_path / "lmdata_fake_format.py").write_text("import s3fs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "s3fs", None)
    monkeypatch.setitem(formats.FORMATS, "fake", "lmdata_fake_format")
    with pytest.raises(MissingDependencyError) as ei:
        formats._load("fake")
    assert "format 'fake' needs the package 's3fs'" in str(ei.value)
    assert "pip install 'lmdata[s3]'" in str(ei.value)
    err = _deps.missing("matplotlib", "plotting")
    assert "pip install 'lmdata[plot]'" in str(err) and "'matplotlib'" in str(err)


@pytest.mark.parametrize(
    "bad",
    [[7], ["bytes", 3], [{"configuration": {}}], {"name": "bytes"}, [{"name": "gzip"}]],
)
def test_bad_shard_index_codecs_are_a_format_error(tmp_path, bad):
    p = _sharded_store(tmp_path / "z.zarr")
    f = p / "train" / "encoded_tokens" / "zarr.json"
    meta = json.loads(f.read_text())
    meta["codecs"][0]["configuration"]["index_codecs"] = bad
    f.write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"index_codecs|index codecs"):
        lmdata.open(p)
    problems = lmdata.validate(p)
    assert any("index" in x and "zarr.json" in x for x in problems), problems


def test_jq_programs_name_the_jq_extra(tmp_path, monkeypatch):
    """jq is the ``lmdata[jq]`` extra: dolma's jq filters and modalities' jq_pattern say so."""
    from lmdata.dolma.jsonpath import JqExpr
    from lmdata.formats.modalities.views import JsonlTokenDocuments
    from lmdata.formats.modalities_jsonl import build_index

    (tmp_path / "d.jsonl").write_bytes(b'{"text": "a"}\n')
    build_index(tmp_path / "d.jsonl")
    docs = JsonlTokenDocuments(tmp_path / "d.jsonl", tokenizer=None, jq_pattern=".text")
    monkeypatch.setitem(sys.modules, "jq", None)
    for read in (lambda: JqExpr(".x | not").matches({"x": 1}), lambda: docs.text(0)):
        with pytest.raises(MissingDependencyError, match=r"pip install 'lmdata\[jq\]'"):
            read()
