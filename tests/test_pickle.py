"""The allow-list unpickler: plain data loads, anything else is refused before it runs."""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmdata._pickle import safe_loads
from lmdata.errors import CorruptDataError, UnsafeDataError

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False),
    lambda c: (
        st.lists(c)
        | st.tuples(c, c)
        | st.dictionaries(st.text(), c)
        | st.frozensets(st.integers())
        | st.sets(st.text())
    ),
    max_leaves=20,
)


@given(obj=plain, protocol=st.integers(2, 5))
def test_plain_data_round_trips(obj, protocol):
    assert safe_loads(pickle.dumps(obj, protocol=protocol)) == obj


def test_numpy_arrays_and_scalars_load():
    obj = {"a": np.arange(5, dtype=np.uint16), "b": np.float32(1.5), "c": np.zeros((2, 3))}
    got = safe_loads(pickle.dumps(obj))
    assert np.array_equal(got["a"], obj["a"]) and got["a"].dtype == np.uint16
    assert got["b"] == np.float32(1.5)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lmdata-pwned",))


def test_code_is_refused_not_run(tmp_path):
    data = pickle.dumps([1, Evil()])
    with pytest.raises(UnsafeDataError, match="system") as ei:
        safe_loads(data, path="shard/0", where="block 3")
    assert "shard/0" in str(ei.value) and "block 3" in str(ei.value)
    assert "allow_unsafe_pickle" in str(ei.value)
    assert not os.path.exists("/tmp/lmdata-pwned")


@given(junk=st.binary(max_size=200))
def test_garbage_is_corrupt_data_error(junk):
    try:
        safe_loads(junk, path="f")
    except (CorruptDataError, UnsafeDataError):
        pass


def test_allocation_bombs_are_refused():
    # set(range(3e9)): 49 bytes of pickle, tens of GB of memory
    bomb = b"\x80\x04cbuiltins\nset\n(cbuiltins\nrange\n(L3000000000\ntRtR."
    with pytest.raises(UnsafeDataError, match="range"):
        safe_loads(bomb)

    class Prealloc:
        def __reduce__(self):
            from numpy._core.multiarray import _reconstruct

            return (_reconstruct, (np.ndarray, (10**10,), b"b"))

    with pytest.raises(UnsafeDataError, match="preallocated"):
        safe_loads(pickle.dumps(Prealloc()))
    with pytest.raises(UnsafeDataError, match="unbounded"):
        safe_loads(b"\x80\x04cbuiltins\nbytes\n(L10000000000\ntR.")


@pytest.mark.parametrize(
    "bomb",
    [
        b"\x80\x04Nr\x00\x00\x00\x48.",  # LONG_BINPUT into slot 1.2e9: a 19 GB memo
        b"\x80\x04Np1200000000\n.",  # PUT, the text form
        b"(lp0\nNap1200000000\n.",  # protocol 0
        # PUT's line is read as int() reads it: a sign, spaces, underscores, leading zeros
        b"\x80\x04Np+1200000000\n.",
        b"\x80\x04Np 1200000000 \n.",
        b"\x80\x04Np1_200_000_000\n.",
        b"\x80\x04Np" + b"0" * 30 + b"1200000000\n.",
    ],
)
@pytest.mark.parametrize("walk", ["c", "python"])
def test_memo_bombs_are_refused_before_allocating(bomb, walk, monkeypatch):
    from lmdata import _pickle

    monkeypatch.setattr(_pickle, "_sparse_memo", lambda: False)  # as on an unfixed Python
    if walk == "python":
        monkeypatch.setattr(_pickle, "_c_early_slot", None)
    with pytest.raises(UnsafeDataError, match="memo slot 12"):
        safe_loads(bomb, path="f")


def _c_walk():
    from lmdata import _pickle

    if _pickle._c_early_slot is None:
        pytest.skip("lmdata._native.memowalk was not built (no C compiler at install)")
    return _pickle


@given(
    obj=plain,
    protocol=st.integers(0, 5),
    tail=st.sampled_from([b".", b"r\x00\x00\x00\x48.", b"r\x05\x00", b"r", b"X\xff\xff"]),
    cut=st.integers(0, 64),
)
def test_c_walk_answers_as_the_python_walk(obj, protocol, tail, cut):
    # real pickles, bombs after them, and truncations anywhere (even inside an opcode)
    P = _c_walk()
    data = pickle.dumps(obj, protocol=protocol)[:-1] + tail
    for d in (data, data[: max(0, len(data) - cut)]):
        assert P._early_slot(d) == P._py_early_slot(d)


@given(junk=st.binary(max_size=200))
def test_c_walk_answers_as_the_python_walk_on_any_bytes(junk):
    P = _c_walk()
    assert P._early_slot(junk) == P._py_early_slot(junk)


@given(obj=plain, protocol=st.integers(0, 5))
def test_memo_check_passes_every_real_pickle(obj, protocol):
    # protocols 0-3 store every object with PUT/BINPUT/LONG_BINPUT, in order
    if protocol < 2 and any(isinstance(x, complex) for x in _leaves(obj)):
        return  # complex pickles need copyreg at protocol < 2, which the allow-list refuses
    data = pickle.dumps(obj, protocol=protocol)
    try:
        got = safe_loads(data)
    except UnsafeDataError as e:
        assert "memo" not in str(e)
        return
    assert got == obj


def _leaves(obj):
    if isinstance(obj, (list, tuple, set, frozenset)):
        for x in obj:
            yield from _leaves(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _leaves(x)
    else:
        yield obj


def test_opcode_table_matches_pickletools():
    import pickletools

    from lmdata import _pickle

    for op in pickletools.opcodes:
        k = _pickle._OPCODES[ord(op.code)]
        arg = op.arg
        if arg is None:
            assert k in (1, _pickle._STOP), op.name
        elif arg.n >= 0:
            assert k == 1 + arg.n or k == _pickle._LONG_BINPUT, op.name
        elif arg.n == pickletools.UP_TO_NEWLINE:
            assert k in (_pickle._LINE, _pickle._PUT, _pickle._TWO_LINES), op.name
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
            assert k == _pickle._COUNT1, op.name
        elif arg.n in (pickletools.TAKEN_FROM_ARGUMENT4, pickletools.TAKEN_FROM_ARGUMENT4U):
            assert k == _pickle._COUNT4, op.name
        else:
            assert arg.n == pickletools.TAKEN_FROM_ARGUMENT8U and k == _pickle._COUNT8, op.name
    assert sum(1 for k in _pickle._OPCODES if k) == len(pickletools.opcodes)


def test_memo_check_runs_where_this_python_needs_it(monkeypatch):
    from lmdata import _pickle

    probe = _pickle._sparse_memo.__wrapped__
    if sys.version_info < (3, 12):  # 3.11 has the dense memo table (gh-115952)
        assert probe() is False
    # the probe is what decides; where it says the unpickler is fixed, the bomb is harmless
    bomb = b"\x80\x04Nr\x00\x00\x00\x48."
    monkeypatch.setattr(_pickle, "_sparse_memo", lambda: False)
    with pytest.raises(UnsafeDataError, match="memo slot"):
        safe_loads(bomb)


@given(obj=plain, protocol=st.integers(0, 5), far=st.integers(1, 2**31))
def test_memo_bomb_after_any_real_pickle_is_found_where_it_is(obj, protocol, far):
    # the walk steps over every real opcode (strings holding b"r", ints, frames) to reach it
    from lmdata._pickle import _early_slot

    data = pickle.dumps(obj, protocol=protocol)[:-1]  # without STOP: ends on an opcode
    at = len(data)
    slot = at + far
    assert _early_slot(data + b"r" + slot.to_bytes(4, "little") + b".") == (slot, at)
    assert _early_slot(data + b"p%d\n." % slot) == (slot, at)
    assert _early_slot(data + b"r" + at.to_bytes(4, "little") + b".") == (0, 0)


# ---- one item of a pickled list, unpickled alone (load_item) ---------------------------------

needs_c_walk = pytest.mark.skipif(
    getattr(__import__("lmdata._pickle").__dict__["_pickle"], "_c_item_pickle", None) is None,
    reason="lmdata._native.memowalk was not built (no C compiler at install)",
)


def _same(a, b) -> bool:
    """Equal, of the same types all the way down: the repr of these plain values is exact (it
    tells a tuple from a list, 1 from 1.0, -0.0 from 0.0) and, unlike ==, holds a NaN equal to
    a NaN (two NaN objects inside tuples compare unequal)."""
    return repr(a) == repr(b)


@st.composite
def lists_sharing_objects(draw) -> list:
    """Plain items, then some that refer to objects of earlier ones (the memo gets across
    items)."""
    items = draw(st.lists(plain, max_size=12))
    shared = draw(st.lists(st.integers(0, 11), max_size=6))
    return items + [{"again": items[k]} for k in shared if k < len(items)]


@needs_c_walk
@given(items=lists_sharing_objects(), protocol=st.integers(2, 5))
def test_one_item_alone_equals_that_item_of_the_whole(items, protocol):
    from lmdata._pickle import load_item

    data = pickle.dumps(items, protocol=protocol)
    whole = pickle.loads(data)
    for j in range(len(items)):
        found, item = load_item(data, j, len(items))
        assert (found and _same(item, whole[j])) or (not found and item is None)
    assert not any(load_item(data, j, len(items) + 1)[0] for j in range(len(items)))


@needs_c_walk
def test_examples_like_datasets_load_alone():
    from lmdata._pickle import load_item

    ex = [
        {"id": i, "text": "word " * (i % 7), "tags": ["news", "sport"][: i % 3], "x": (i, 1.5)}
        for i in range(40)
    ]
    big = ["x" * 30_000 + str(i) for i in range(8)]  # several protocol-4 frames
    for items in (ex, big, [None], []):
        for protocol in (4, 5):
            data = pickle.dumps(items, protocol=protocol)
            for j in range(len(items)):
                assert load_item(data, j, len(items)) == (True, items[j])
    # Older protocols write memo slots explicitly (BINPUT): the whole list is unpickled.
    assert load_item(pickle.dumps(ex, protocol=2), 3, 40) == (False, None)


@needs_c_walk
@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps([1, os.system], protocol=4),  # a global: the allow-list must see it
        pickle.dumps([1, np.arange(3)], protocol=4),  # REDUCE
        b"\x80\x04]\x94(K\x01r\x00\x00\x00\x40e.",  # a memo write by index (a bomb)
        b"\x80\x04]\x94(K\x01h\x05e.",  # a memo get of a slot never made
        b"\x80\x04]\x94(K\x01K\x02ue.",  # setitems into the list
        b"\x80\x04]\x94(" + b"]" * 100 + b"(" * 100 + b"e.",  # deeper than the walk follows
        b"\x80\x04]\x94(K\x01K\x02e",  # no STOP
        b"\x80\x04]\x94K\x01a]\x94h\x00a.",  # an item holds the list itself
    ],
)
def test_anything_outside_plain_lists_is_left_to_the_whole_load(data):
    from lmdata._pickle import load_item

    assert load_item(data, 0, 1) == (False, None)
    assert load_item(data, 0, 2) == (False, None)


@needs_c_walk
@given(
    items=st.lists(plain, min_size=1, max_size=6),
    protocol=st.integers(4, 5),
    at=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    cut=st.integers(0, 10_000),
)
def test_damaged_lists_never_give_another_item(items, protocol, at, byte, cut):
    """A byte changed or the end cut: where the whole list still loads, the item found alone is
    the whole load's. (Where it does not, an item whose own bytes are intact may still be found,
    as in formats that store items apart: a bad string in item 2 does not hide item 0.)"""
    from lmdata._pickle import load_item

    data = bytearray(pickle.dumps(items, protocol=protocol))
    data[at % len(data)] = byte
    data = bytes(data[: len(data) - cut % 4])
    try:
        whole = pickle.loads(data)
    except Exception:
        whole = None
    for j in range(len(items)):
        found, item = load_item(data, j, len(items))
        if found and isinstance(whole, list) and len(whole) == len(items):
            assert _same(item, whole[j])


@given(obj=plain, protocol=st.integers(0, 5), tail=st.binary(max_size=8))
def test_prefix_length_is_where_the_pickle_ends(obj, protocol, tail):
    """Whether the C walk vouches for the pickle (plain.loads) or the allow-list unpickler
    reads it, the value and the length taken are the same."""
    from lmdata._pickle import safe_load_prefix

    data = pickle.dumps(obj, protocol=protocol)
    value, used = safe_load_prefix(data + tail)
    assert used == len(data) and _same(value, pickle.loads(data))


@pytest.mark.parametrize("walk", ["c", "python"])
def test_four_byte_lengths_are_unsigned_as_the_unpickler_reads_them(walk):
    # A string of 2 GiB (length 0x80000000: negative if read as signed) is skipped, so a memo
    # bomb after it is still found. The string's pages are never touched (anonymous mmap).
    import mmap

    from lmdata import _pickle

    if walk == "c":
        _c_walk()
    size = 1 << 31
    try:
        mm = mmap.mmap(-1, 2 + 5 + size + 6)
    except OSError:  # strict overcommit: the untouched pages still count
        pytest.skip("cannot map 2 GiB of address space here")
    try:
        mm[:7] = b"\x80\x04B" + size.to_bytes(4, "little")
        mm[7 + size :] = b"r" + (4 * 10**9).to_bytes(4, "little") + b"."
        walked = _pickle._early_slot(mm) if walk == "c" else _pickle._py_early_slot(mm)
        assert walked == (4 * 10**9, 7 + size)
    finally:
        mm.close()


@given(
    objs=st.lists(plain, max_size=6),
    tail=st.sampled_from([b".", b"r\x00\x00\x00\x48.", b"X\xff\xff"]),
)
def test_walk_all_answers_as_one_walk_per_buffer(objs, tail):
    P = _c_walk()
    bufs = [pickle.dumps(o, protocol=4)[:-1] + tail for o in objs]
    walked = P.walk_all([memoryview(b) for b in bufs])
    assert walked is not None
    assert [tuple(walked[3 * k : 3 * k + 3]) for k in range(len(bufs))] == [
        P._c_early_slot(b, P._TABLE) for b in bufs
    ]


def test_an_unknown_encoding_in_a_protocol_2_bytes_pickle_is_an_lmdata_error():
    # protocol 2 spells bytes as _codecs.encode(str, 'latin1'), an allowed global: a damaged
    # encoding name raised a raw LookupError from the codec registry
    data = pickle.dumps(b"ab", protocol=2)
    assert safe_loads(data) == b"ab"
    with pytest.raises(UnsafeDataError, match="latn1x") as e:
        safe_loads(data.replace(b"latin1", b"latn1x"), where="block 3", path="f")
    assert e.value.path == "f" and e.value.position == "block 3"


def test_bytes_decode_from_latin1_only():
    # _codecs.encode is allowed for the bytes of protocols 0-2, with any arguments it once was:
    # punycode is quadratic (a pickle of 100 KB ran for half an hour), other codecs allocate.
    # Refused before any codec runs: a text short enough that running punycode would take no
    # time, so a regression fails below (no error raised) rather than by the clock
    for protocol in (0, 1, 2):
        for b in (b"", b"ab\xff\x00", bytearray(b"xy")):
            assert _same(safe_loads(pickle.dumps(b, protocol=protocol)), b)
    text = "".join(chr(0x100 + k) for k in range(200))
    slow = b"\x80\x02c_codecs\nencode\nX" + len(text.encode()).to_bytes(4, "little")
    slow += text.encode() + b"X\x08\x00\x00\x00punycode\x86R."
    assert pickle.loads(slow) == text.encode("punycode")  # (what an unchecked load returns)
    with pytest.raises(UnsafeDataError, match="latin1") as e:
        safe_loads(slow, where="block 3", path="f")
    assert e.value.path == "f"
    # bytearray(str, encoding) likewise: protocols 0-2 pass 'latin-1'
    for protocol in (0, 1, 2):
        assert _same(
            safe_loads(pickle.dumps(bytearray(b"a\xff"), protocol=protocol)), bytearray(b"a\xff")
        )
    slow = slow.replace(b"c_codecs\nencode\n", b"cbuiltins\nbytearray\n")
    assert pickle.loads(slow) == bytearray(text.encode("punycode"))
    with pytest.raises(UnsafeDataError, match="latin-1"):
        safe_loads(slow, where="block 3", path="f")


def test_numpy_scalars_load_but_not_a_scalar_without_its_bytes():
    # numpy's scalar reconstructor without the bytes allocates and zeroes the dtype's itemsize:
    # 60 bytes of pickle once made 800 MB
    for x in (np.float32(1.5), np.int64(-3), np.void(b"ab"), np.str_("hé"), np.datetime64(5, "D")):
        for protocol in (2, 4, 5):
            assert _same(safe_loads(pickle.dumps(x, protocol=protocol)), x)

    def s(text: str) -> bytes:
        return b"\x8c" + bytes([len(text)]) + text.encode()

    dtype = s("numpy") + s("dtype") + b"\x93" + s("V800000000") + b"\x85R"
    bomb = b"\x80\x04" + s("numpy._core.multiarray") + s("scalar") + b"\x93" + dtype + b"\x85R."
    with pytest.raises(UnsafeDataError, match="scalar with 1 argument") as e:
        safe_loads(bomb, where="block 3", path="f")
    assert e.value.path == "f"


# ---- a block's index, then one item per read (block_index, load_indexed) ---------------------


@needs_c_walk
@given(items=lists_sharing_objects(), protocol=st.integers(2, 5))
def test_an_item_through_the_index_is_the_item_found_alone(items, protocol):
    from lmdata._pickle import NOT_ALONE, block_index, load_indexed, load_item

    data = pickle.dumps(items, protocol=protocol)
    for j in range(len(items)):
        alone = load_item(data, j, len(items))
        got = block_index(data, len(items), j)
        if got is None:  # the walk vouches for no item of the list
            assert not alone[0]
            continue
        index, first = got
        again = load_indexed(data, index, j)
        for item in (first, again):
            assert (item is NOT_ALONE and not alone[0]) or _same(item, alone[1])
    assert block_index(data, len(items) + 1, 0) is None  # another count: the whole list


@needs_c_walk
def test_an_index_names_the_earlier_strings_items_share():
    from lmdata._pickle import block_index, load_indexed

    ex = [{"id": i, "text": "w" * i, "tags": ["news", "sport"][: i % 3]} for i in range(40)]
    data = pickle.dumps(ex, protocol=4)
    index, item = block_index(data, 40, 7)
    assert item == ex[7]
    assert len(index) < 40 * 12 + 12 * 8 + 12  # per item 12 bytes; a few shared strings
    assert [load_indexed(data, index, j) for j in range(40)] == ex


@needs_c_walk
@given(
    items=st.lists(plain, min_size=1, max_size=6),
    other=st.lists(plain, min_size=1, max_size=6),
    at=st.integers(0, 10_000),
    byte=st.integers(0, 255),
)
def test_a_damaged_or_foreign_index_gives_plain_values_or_nothing(items, other, at, byte):
    """An index that is not the data's (another block's, or damaged) never makes the item
    pickle name a global, call code or write the memo: whatever comes back is plain data."""
    from lmdata._pickle import NOT_ALONE, _c_item_at, block_index, load_indexed

    data = pickle.dumps(items, protocol=4)
    got = block_index(pickle.dumps(other, protocol=4), len(other), 0)
    if got is None:
        return
    bad = bytearray(got[0])
    bad[at % len(bad)] = byte
    for index in (got[0], bytes(bad), bytes(bad[:-1])):
        for j in range(-1, len(other) + 1):
            made = _c_item_at(data, j, index)
            if made is None:
                continue
            walked = _c_walk()._c_early_slot(made, _c_walk()._TABLE)
            assert walked[0] == 0  # no memo write beyond its place
            assert walked[2] > 0  # walked to STOP: no global, call or extension opcode
            item = load_indexed(data, index, j)
            assert item is NOT_ALONE or safe_loads(made) is not None or item is None


@pytest.mark.parametrize("walk", ["c", "python"])
@pytest.mark.parametrize("op, width", [(b"B", 4), (b"X", 4), (b"\x8e", 8), (b"\x8d", 8)])
def test_a_count_beyond_the_data_is_refused_before_unpickling(op, width, walk, monkeypatch):
    # Python 3.11's unpickler allocates a BINBYTES8/BINUNICODE8 (and 4-byte) count before
    # reading: a 20-byte pickle would ask for a terabyte
    from lmdata import _pickle

    if walk == "c":
        _c_walk()
    else:
        monkeypatch.setattr(_pickle, "_c_early_slot", None)
    monkeypatch.setattr(_pickle, "_sparse_memo", lambda: False)  # as on Python 3.11
    count = (1 << 40) if width == 8 else (1 << 32) - 1
    data = b"\x80\x04]\x94(K\x01" + op + count.to_bytes(width, "little") + b"abc" + b"e."
    assert _pickle._early_slot(data) == (-2, 7)
    with pytest.raises(CorruptDataError, match="byte 7 claims more bytes") as e:
        safe_loads(data, where="block 3", path="f")
    assert e.value.path == "f" and e.value.position == "block 3"
    # one byte short of the data: the same; exactly the data: read
    exact = b"\x80\x04" + op + (3).to_bytes(width, "little") + b"abc."
    assert safe_loads(exact) in (b"abc", "abc")
    assert _pickle._early_slot(exact[:-1] + b"") == (0, 0)
    with pytest.raises(CorruptDataError):
        safe_loads(b"\x80\x04" + op + (4).to_bytes(width, "little") + b"abc.")
