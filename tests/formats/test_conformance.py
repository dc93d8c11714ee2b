"""One suite for every registered format: the same checks, whatever the format.

Each format gets a hypothesis strategy for the items its writer takes (below, in ``ITEMS``); a
format registered without one fails :func:`test_every_format_has_a_strategy`, so a new format
cannot skip the suite. The checks: round trip through ``lmdata.writer`` / ``lmdata.open``; the
reader protocol of the format's kind; pickling; ``close()`` and ``info()``; detection;
``validate`` clean on the format's own output; ``convert`` from JSONL (or flat-tokens) giving
what the writer gives; and corruptions (truncation, bit flips, deleted files) that end in an
``lmdata.errors`` exception naming a file of the dataset, or in data that still reads.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata import formats
from lmdata._api import merge
from lmdata.convert import convert
from lmdata.errors import LmdataError
from lmdata.protocols import Records, TokenSequences

ALL = formats.names()

# ---- what each format's writer takes ---------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_plain_text = st.text("abcdefghij klmnopqrstuvwxyz", max_size=30)  # csv/tsv hold no quoting
_int = st.integers(-(2**63), 2**63 - 1)
_json = st.recursive(
    st.none() | st.booleans() | _int | _text,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_text, kids, max_size=3),
    max_leaves=8,
)


def _token_docs(least: int) -> st.SearchStrategy:
    return st.lists(
        st.lists(st.integers(0, 2**16), max_size=30).map(lambda x: np.array(x, dtype=np.uint32)),
        min_size=least,
        max_size=12,
    )


def _rows(columns: dict[str, st.SearchStrategy], least: int) -> st.SearchStrategy:
    return st.lists(st.fixed_dictionaries(columns), min_size=least, max_size=12)


_WRITES: dict[str, Any] = {  # format -> its items as a function of the least count
    "flat-tokens": _token_docs,
    "modalities": _token_docs,
    "atlas": lambda least: st.lists(
        st.dictionaries(_text, _json, max_size=4), min_size=least, max_size=12
    ),
    # MDS columns are inferred from the first sample: a fixed schema, and an int beyond 64 bits
    "mds": lambda least: _rows(
        {
            "id": _int,
            "big": st.integers(2**64, 2**80),
            "text": _text,
            "blob": st.binary(max_size=20),
            "meta": st.dictionaries(_text, _json, max_size=3),
        },
        least,
    ),
    "mds-csv": lambda least: _rows({"text": _plain_text, "n": _int}, least),
    "mds-tsv": lambda least: _rows({"text": _plain_text, "n": _int}, least),
    "mds-jsonl": lambda least: _rows({"text": _text, "n": _int}, least),
    "dolma": lambda least: st.lists(
        st.fixed_dictionaries({"text": _text, "source": _plain_text}),
        min_size=least,
        max_size=12,
    ).map(lambda docs: [{"id": str(i), **d} for i, d in enumerate(docs)]),
    "jsonl": lambda least: st.lists(_json, min_size=least, max_size=12),
    "modalities-jsonl": lambda least: st.lists(
        st.dictionaries(_text, _json, max_size=4), min_size=least, max_size=12
    ),
}


def items_of(name: str, least: int = 0) -> st.SearchStrategy:
    """What the writer of format ``name`` takes: lists of at least ``least`` items (drawn so,
    never filtered: a filter a health check can trip fails runs at random)."""
    return _WRITES[name](least)


ITEMS: dict[str, st.SearchStrategy] = {name: items_of(name) for name in _WRITES}

SUFFIX = {"modalities": ".pbin", "jsonl": ".jsonl", "modalities-jsonl": ".jsonl"}
SETTINGS = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _plain(x: Any) -> Any:
    """A comparable form of an item (arrays as lists)."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _write(root: Path, name: str, items: list[Any], **options: Any) -> Path:
    path = root / f"{name}{SUFFIX.get(name, '')}"
    if path.exists():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    opts: dict[str, Any] = dict(options)
    if name == "mds-csv" or name == "mds-tsv" or name == "mds-jsonl":
        opts["columns"] = {"text": "str", "n": "int"}
    if name == "mds" and not items:
        opts["columns"] = {"id": "int"}
    with lmdata.writer(path, name, **opts) as w:
        for item in items:
            w.write(item)
    return path


def _read(r: Any) -> list[Any]:
    return [_plain(x) for x in r]


def _comparable(name: str, got: list[Any], want: list[Any]) -> tuple[list[Any], list[Any]]:
    if name == "dolma":  # documents may gain fields with defaults; compare what was written
        got = [{k: g.get(k) for k in w} for g, w in zip(got, want, strict=True)]
    return got, want


# ---- the checks ------------------------------------------------------------------------------


def test_every_format_has_a_strategy() -> None:
    assert sorted(ITEMS) == sorted(ALL), "add the new format's items to ITEMS"


@pytest.mark.parametrize("name", ALL)
def test_spec_is_consistent(name: str) -> None:
    spec = formats.spec(name)
    assert spec.name == name
    assert spec.kind in ("records", "tokens")
    for alias in spec.aliases:
        assert formats.canonical(alias) == name
    if spec.splits:
        assert spec.has_splits


@pytest.mark.parametrize("name", ALL)
def test_round_trip_protocol_pickle_info(name: str, tmp_path_factory: Any) -> None:
    @SETTINGS
    @given(items=ITEMS[name], data=st.data())
    def check(items: list[Any], data: st.DataObject) -> None:
        root = tmp_path_factory.mktemp(name.replace("-", "_"))
        path = _write(root, name, items)
        spec = formats.spec(name)
        found = lmdata.detect(path)
        # an empty MDS-family index names no shard format: any name of the family reads it
        assert found == name or (not items and formats.spec(found).detect is spec.detect)
        with lmdata.open(path, format=name) as r:
            proto = TokenSequences if spec.kind == "tokens" else Records
            assert isinstance(r, proto)
            if spec.kind == "records":
                assert not isinstance(r, TokenSequences)  # the kind is the format's
            want = [_plain(x) for x in items]
            assert len(r) == len(want)
            got, want = _comparable(name, _read(r), want)
            assert got == want
            if want:
                order = data.draw(st.permutations(range(len(want))))
                taken, _ = _comparable(name, [_plain(x) for x in r.take(order)], want)
                assert taken == [want[i] for i in order]
                i = data.draw(st.integers(-len(want), len(want) - 1))
                one, _ = _comparable(name, [_plain(r[i])], [want[i]])
                assert one == [want[i]]
            with pytest.raises(IndexError):
                r[len(want)]
            if spec.kind == "tokens":
                lengths = [len(x) for x in items]
                assert r.boundaries.tolist() == [0, *np.cumsum(lengths, dtype=np.int64).tolist()]
                assert r.num_tokens == sum(lengths)
            clone = pickle.loads(pickle.dumps(r))
            assert _comparable(name, _read(clone), want)[0] == want
            assert isinstance(r.info(), dict)
        r.close()  # closing twice is harmless
        assert lmdata.validate(path, format=name) == []
        assert lmdata.info(path, format=name)["format"] == name

    check()


@pytest.mark.parametrize("name", [n for n in ALL if formats.spec(n).kind == "records"])
def test_convert_agrees_with_the_writer(name: str, tmp_path_factory: Any) -> None:
    """Records converted from a JSONL source read back as the writer's own output does."""

    @SETTINGS
    @given(items=items_of(name, least=1))  # (non-empty by construction)
    def check(items: list[Any]) -> None:
        items = [_without_bytes(x) for x in items]  # JSONL, the source, cannot carry bytes
        root = tmp_path_factory.mktemp("convert")
        direct = _write(root, name, items)
        src = _write(root, "jsonl", items)
        dst = root / f"converted{SUFFIX.get(name, '')}"
        opts = {"columns": {"text": "str", "n": "int"}} if name in ("mds-csv", "mds-tsv") else {}
        convert(src, dst, name, workers=0, writer_options=opts)
        assert _read(lmdata.open(dst)) == _read(lmdata.open(direct))

    check()


def _without_bytes(x: Any) -> Any:
    """A record without its bytes fields (the only values a JSONL source cannot hold)."""
    if isinstance(x, dict):
        return {k: v for k, v in x.items() if not isinstance(v, bytes)}
    return x


def test_convert_to_mds_stores_what_the_mds_writer_stores(tmp_path: Path) -> None:
    """The issue's example: an int beyond 64 bits converts as the MDS writer writes it."""
    with lmdata.writer(tmp_path / "a.jsonl", "jsonl") as w:
        w.write({"b": 2**70})
    convert(tmp_path / "a.jsonl", tmp_path / "m", "mds", workers=0)
    assert lmdata.open(tmp_path / "m")[0] == {"b": 2**70}


@pytest.mark.parametrize("name", [n for n in ALL if formats.spec(n).kind == "tokens"])
def test_token_formats_convert_into_each_other(name: str, tmp_path: Path) -> None:
    docs = [np.array(d, dtype=np.uint32) for d in ([1, 2, 3], [], [7], list(range(1, 50)))]
    for other in [n for n in ALL if formats.spec(n).kind == "tokens"]:
        (tmp_path / other).mkdir()
        src = _write(tmp_path / other, other, docs)
        dst = tmp_path / f"{other}-to-{name}{SUFFIX.get(name, '')}"
        convert(src, dst, name, workers=0, split="train" if formats.spec(other).splits else None)
        assert _read(lmdata.open(dst)) == _read(lmdata.open(src))


# ---- corruption ------------------------------------------------------------------------------


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path, *(p for p in path.parent.iterdir() if p != path and p.is_file())]
    return sorted(p for p in path.rglob("*") if p.is_file())


def _exercise(path: Path) -> None:
    """Everything a user does with a dataset: open, read all, read at random, validate (with
    progress reported: never backwards, never beyond the total, even on damaged data)."""
    with lmdata.open(path) as r:
        n = len(r)
        list(r)
        if n:
            r.take(list(range(n))[::-1])
            r[n - 1]
    for verb in (lmdata.validate, lmdata.info):
        rec = _Progress(verb.__name__)
        try:
            verb(path, progress=rec)
        finally:
            rec.check_monotonic()


def _names_a_file(err: LmdataError, root: Path, files: list[Path]) -> bool:
    text = str(err)
    return any(f.name in text for f in files) or root.name in text or str(root) in text


_DOCS = {
    "flat-tokens": [np.arange(1, 40, dtype=np.uint32), np.arange(5, 9, dtype=np.uint32)] * 3,
    "modalities": [np.arange(1, 40, dtype=np.uint32), np.arange(5, 9, dtype=np.uint32)] * 3,
}


def _sample(name: str) -> list[Any]:
    if name in _DOCS:
        return _DOCS[name]
    example = {
        "atlas": [{"a": i, "t": "x" * i} for i in range(20)],
        "mds": [{"id": i, "text": "y" * i} for i in range(20)],
        "mds-csv": [{"text": "z" * i, "n": i} for i in range(20)],
        "mds-tsv": [{"text": "z" * i, "n": i} for i in range(20)],
        "mds-jsonl": [{"text": "z" * i, "n": i} for i in range(20)],
        "dolma": [{"id": str(i), "text": "w " * i, "source": "s"} for i in range(20)],
        "jsonl": [{"k": i, "v": [i, "q"]} for i in range(20)],
        "modalities-jsonl": [{"k": i, "v": [i, "q"]} for i in range(20)],
    }
    return example[name]


@pytest.mark.parametrize("name", ALL)
def test_corruption_is_an_lmdata_error_naming_the_file(name: str, tmp_path_factory: Any) -> None:
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        root = tmp_path_factory.mktemp("corrupt")
        path = _write(root, name, _sample(name))
        files = _files(path)
        victim = data.draw(st.sampled_from(files))
        size = victim.stat().st_size
        how = data.draw(st.sampled_from(["truncate", "flip", "delete", "empty"]))
        if how == "truncate" and size:
            with open(victim, "r+b") as f:
                f.truncate(data.draw(st.integers(0, size - 1)))
        elif how == "flip" and size:
            raw = bytearray(victim.read_bytes())
            for _ in range(data.draw(st.integers(1, 4))):
                raw[data.draw(st.integers(0, size - 1))] ^= 1 << data.draw(st.integers(0, 7))
            victim.write_bytes(bytes(raw))
        elif how == "delete":
            os.unlink(victim)
        else:
            victim.write_bytes(b"")
        try:
            _exercise(path)
        except LmdataError as e:
            assert _names_a_file(e, path, files), f"{how} {victim.name}: {e}"

    check()


# ---- progress --------------------------------------------------------------------------------


class _Progress:
    """Records the :class:`lmdata.Progress` events of one verb (``what``: its phase)."""

    def __init__(self, what: str | None = None) -> None:
        self.what = what
        self.calls: list[tuple[int, int]] = []

    def __call__(self, e: lmdata.Progress) -> None:
        assert isinstance(e, lmdata.Progress) and e.unit == "bytes", e
        if self.what is not None:
            assert e.what == self.what, e
        assert e.total is not None, e
        self.calls.append((e.done, e.total))

    def check_monotonic(self) -> None:
        if not self.calls:
            return
        assert self.calls[0][0] == 0, "the first event announces the total"
        assert len({t for _, t in self.calls}) == 1, f"the total changed: {self.calls}"
        dones = [d for d, _ in self.calls]
        assert dones == sorted(dones), f"progress went backwards: {self.calls}"
        assert 0 <= dones[-1] <= self.calls[0][1]

    def check_complete(self, steps: int) -> None:
        """Monotonic, ending at the total after at least ``steps`` reports of progress."""
        assert self.calls, "no progress reported"
        self.check_monotonic()
        total = self.calls[0][1]
        assert self.calls[-1] == (total, total), f"did not end at the total: {self.calls}"
        assert len({d for d, _ in self.calls[1:] if d}) >= steps, self.calls


# writer options that give the sample several shards / chunks / files
_SMALL_SHARDS: dict[str, dict[str, Any]] = {
    "flat-tokens": {"chunk_tokens": 16, "seq_starts_chunk": 4},
    "atlas": {"shard_size": 6, "block_size": 2},
    "mds": {"size_limit": 100},
    "mds-csv": {"size_limit": 100},
    "mds-tsv": {"size_limit": 100},
    "mds-jsonl": {"size_limit": 100},
    "dolma": {"max_file_docs": 6},
}


@pytest.mark.parametrize("name", ALL)
def test_progress_is_monotonic_and_ends_at_the_total(name: str, tmp_path: Path) -> None:
    """validate, info and merge report bytes of progress: the total first, then one report
    per shard, chunk or file (several for a dataset of several), ending at the total."""
    spec = formats.spec(name)
    small = _SMALL_SHARDS.get(name, {})
    (tmp_path / "a").mkdir()
    path = _write(tmp_path / "a", name, _sample(name), **small)
    rec = _Progress("validate")
    assert lmdata.validate(path, format=name, progress=rec) == []
    rec.check_complete(steps=3 if small else 1)
    assert rec.calls[0][1] > 0
    rec = _Progress("info")
    assert lmdata.info(path, format=name, progress=rec)["format"] == name
    rec.check_complete(steps=1)
    if spec.merge is None:
        return
    (tmp_path / "b").mkdir()
    other = _write(tmp_path / "b", name, _sample(name)[::-1], **small)
    if other.is_dir():  # MDS partitions are brought into the output by name: not twice one
        other = other.rename(other.with_name("second"))
    out = tmp_path / f"merged{SUFFIX.get(name, '')}"
    rec = _Progress("merge")
    merge([path, other], out, format=name, progress=rec)
    rec.check_complete(steps=2)
    assert lmdata.validate(out, format=name) == []


@pytest.mark.parametrize("name", ALL)
def test_progress_on_an_object_store(name: str, memory_root: str) -> None:
    """The same reports where no file can be mapped or listed locally (memory://)."""
    path = f"{memory_root}/{name}{SUFFIX.get(name, '')}"
    opts: dict[str, Any] = dict(_SMALL_SHARDS.get(name, {}))
    if name in ("mds-csv", "mds-tsv", "mds-jsonl"):
        opts["columns"] = {"text": "str", "n": "int"}
    with lmdata.writer(path, name, **opts) as w:
        for item in _sample(name):
            w.write(item)
    for verb in (lmdata.validate, lmdata.info):
        rec = _Progress(verb.__name__)
        verb(path, format=name, progress=rec)
        rec.check_complete(steps=1)
