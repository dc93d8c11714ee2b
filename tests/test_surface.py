"""lmdata/__init__.py: the public surface reads as one API: ``dir(lmdata)`` is ``__all__``;
``convert`` and ``merge`` are functions on it; every verb takes the path first, ``format=`` for
the format, and ``storage_options`` by keyword only; old spellings warn."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import lmdata
from lmdata.errors import InvalidInputError
from lmdata.formats import MergeSummary

VERBS = ["open", "writer", "validate", "info", "detect", "merge", "convert", "tokenize"]


def test_dir_is_the_public_surface():
    assert dir(lmdata) == sorted(lmdata.__all__)
    assert "TYPE_CHECKING" not in dir(lmdata) and "annotations" not in dir(lmdata)
    for name in lmdata.__all__:
        assert getattr(lmdata, name) is not None


def test_convert_and_merge_are_functions_even_after_their_modules_load():
    import importlib

    module = importlib.import_module("lmdata.convert")  # the module of the same name
    assert callable(lmdata.convert) and lmdata.convert is module.convert
    assert inspect.isfunction(inspect.unwrap(lmdata.merge))
    from lmdata.convert import work_area  # the module's other names stay importable

    assert callable(work_area)


@pytest.mark.parametrize("verb", VERBS)
def test_storage_options_is_keyword_only_and_the_format_is_format(verb):
    params = inspect.signature(getattr(lmdata, verb)).parameters
    assert params["storage_options"].kind is inspect.Parameter.KEYWORD_ONLY
    if verb != "detect":
        assert "format" in params


def test_merge_returns_a_summary_not_a_sentence(tmp_path):
    parts = []
    for k in range(2):
        p = tmp_path / f"{k}.pbin"
        with lmdata.writer(p, "modalities", vocab_size=100) as w:
            w.write(np.arange(1, 4 + k))
        parts.append(p)
    got = lmdata.merge(parts, tmp_path / "m.pbin")
    assert got == MergeSummary("modalities", 2, str(tmp_path / "m.pbin"), 2, tokens=7)
    assert got.line() == f"merged 2 modalities inputs: 2 records, 7 tokens -> {tmp_path}/m.pbin"
    with pytest.raises(AttributeError):
        got.records = 3  # type: ignore[misc]


def test_convert_takes_format_and_warns_on_to(tmp_path):
    src = tmp_path / "a.pbin"
    with lmdata.writer(src, "modalities", vocab_size=100) as w:
        w.write(np.arange(1, 5))
    lmdata.convert(src, tmp_path / "a", format="flat-tokens", workers=0)
    with pytest.warns(DeprecationWarning, match=r"convert\(to=\).*format=") as w:
        lmdata.convert(src, tmp_path / "b", to="flat-tokens", workers=0)
    assert w[0].filename == __file__
    assert lmdata.open(tmp_path / "b")[0].tolist() == lmdata.open(tmp_path / "a")[0].tolist()
    with pytest.raises(InvalidInputError, match="needs the target format"):
        lmdata.convert(src, tmp_path / "c")


def test_tokenize_warns_on_old_spellings(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"tokenize\(to=\)"):
        lmdata.tokenize(iter(["a b"]), tmp_path / "a", to="flat-tokens", workers=0)
    with pytest.warns(DeprecationWarning, match=r"writer_options=\{'chunk_tokens'"):
        lmdata.tokenize(iter(["a b"]), tmp_path / "b", chunk_tokens=64, workers=0)
    lmdata.tokenize(iter(["a b"]), tmp_path / "c", writer_options={"chunk_tokens": 64}, workers=0)
    assert lmdata.open(tmp_path / "b")[0].tolist() == lmdata.open(tmp_path / "c")[0].tolist()
