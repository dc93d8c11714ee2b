"""lmdata._options: every public verb, the Loader and every writer refuse an option they do not
take with an InvalidInputError that names the valid ones and the closest (never a silent no-op,
never a raw TypeError); no format verb swallows options (no ``**kwargs``)."""

from __future__ import annotations

import numpy as np
import pytest

import lmdata
from lmdata import formats
from lmdata._options import check_options, checked, parameters, unknown_option
from lmdata.errors import InvalidInputError
from tests.formats.test_conformance import SUFFIX, _write

ALL = formats.names()
SAMPLE = {  # one item each format's writer takes
    "flat-tokens": np.array([1, 2, 3], dtype=np.uint32),
    "modalities": np.array([1, 2, 3], dtype=np.uint32),
    "mds-csv": {"text": "a", "n": 1},
    "mds-tsv": {"text": "a", "n": 1},
    "mds-jsonl": {"text": "a", "n": 1},
    "dolma": {"id": "0", "text": "a", "source": "s"},
}


def test_the_message_names_the_closest_and_every_valid_option():
    e = unknown_option("eod_idd", ["eod_id", "progress", "storage_options"], "lmdata.validate")
    assert isinstance(e, InvalidInputError) and isinstance(e, ValueError)
    assert str(e) == (
        "unknown option 'eod_idd' for lmdata.validate; did you mean 'eod_id'? "
        "(lmdata.validate takes eod_id, progress, storage_options)"
    )
    assert "did you mean" not in str(unknown_option("zzz", ["eod_id"], "x"))
    assert "takes no options" in str(unknown_option("a", [], "x"))
    check_options(["a"], ["a", "b"], "x")  # valid: nothing raised
    with pytest.raises(InvalidInputError, match="'c'"):
        check_options(["a", "c"], ["a", "b"], "x")


def test_checked_keeps_the_signature_and_refuses_only_unknown_names():
    import inspect

    @checked("f", hide=("old",))
    def f(path: str, *, size: int = 1, old: int = 0) -> int:
        return size + old

    assert list(inspect.signature(f).parameters) == ["path", "size", "old"]
    assert f("p", size=2, old=1) == 3 and f(path="p") == 1
    with pytest.raises(InvalidInputError, match="did you mean 'size'") as e:
        f("p", sise=2)
    assert "takes size)" in str(e.value)  # neither the path nor the deprecated name
    with pytest.raises(TypeError, match="nothing to check"):
        checked("g")(lambda **kw: kw)


@pytest.mark.parametrize("name", ALL)
def test_no_format_verb_swallows_options(name):
    spec = formats.spec(name)
    verbs = {"open": spec.open, "writer": spec.writer, "validate": spec.validate}
    verbs |= {"info": spec.info}
    if spec.merge is not None:
        verbs["merge"] = spec.merge
    for verb, fn in verbs.items():
        assert parameters(fn) is not None, f"{name}'s {verb} takes **kwargs"


@pytest.mark.parametrize("name", ALL)
def test_every_verb_refuses_an_unknown_option_of_every_format(tmp_path, name):
    path = _write(tmp_path, name, [SAMPLE.get(name, {"text": "a", "n": 1})])
    for verb in (lmdata.open, lmdata.validate, lmdata.info):
        with pytest.raises(InvalidInputError, match=r"unknown option 'bogus'.*takes .*format") as e:
            verb(path, bogus=1)
        assert name in str(e.value)
        with pytest.raises(InvalidInputError, match="did you mean 'storage_options'"):
            verb(path, storage_option={})
    with pytest.raises(InvalidInputError, match=r"lmdata.writer of .*did you mean 'overwrite'"):
        lmdata.writer(tmp_path / f"new{SUFFIX.get(name, '')}", name, overwrit=True)
    # --allow-unsafe-pickle is taken by every format's reader (a no-op without pickles)
    lmdata.open(path, allow_unsafe_pickle=True).close()
    assert lmdata.validate(path, allow_unsafe_pickle=False) == []


def test_validate_with_a_misspelt_option_is_refused_and_the_right_one_checks(tmp_path):
    p = tmp_path / "a.pbin"
    with lmdata.writer(p, "modalities", vocab_size=100, eod_id=0) as w:
        w.write(np.array([5, 6, 7]))  # the writer ends it with 0
    with pytest.raises(InvalidInputError, match="did you mean 'eod_id'"):
        lmdata.validate(p, eod_idd=7)  # returned [] (valid) before
    assert lmdata.validate(p, eod_id=7)  # the check the user meant runs: not 7-terminated
    assert lmdata.validate(p, eod_id=0) == []
    with pytest.raises(InvalidInputError, match=r"unknown option 'bogus' for lmdata\.open"):
        lmdata.open(p, bogus=1)  # a raw TypeError from the reader before


@pytest.mark.parametrize(
    "call",
    [
        lambda p, t: lmdata.detect(p, storage_option={}),
        lambda p, t: lmdata.merge([p], t / "m.pbin", overwite=True),
        lambda p, t: lmdata.convert(p, t / "c", "flat-tokens", worker=0),
        lambda p, t: lmdata.convert(p, t / "c", "flat-tokens", writer_options={"chunk_tokns": 8}),
        lambda p, t: lmdata.tokenize(["a b"], t / "t", tokenzier="bytes"),
        lambda p, t: lmdata.tokenize(["a b"], t / "t", writer_options={"chunk_tokns": 8}),
        lambda p, t: lmdata.decode([1, 2], skip_special=True),
        lambda p, t: lmdata.Loader(p, seq_len=2, global_batch_size=1, shufle=False),
        lambda p, t: formats.spec("flat-tokens").writer.resolve()(t / "w", chunk_tokns=8),
    ],
    ids=[
        "detect",
        "merge",
        "convert",
        "convert-writer",
        "tokenize",
        "tokenize-writer",
        "decode",
        "Loader",
        "Writer",
    ],
)
def test_every_public_verb_refuses_a_misspelt_option(tmp_path, call):
    p = tmp_path / "a.pbin"
    with lmdata.writer(p, "modalities", vocab_size=100) as w:
        w.write(np.array([5, 6, 7]))
    with pytest.raises(InvalidInputError, match=r"unknown option .*did you mean"):
        call(p, tmp_path)
