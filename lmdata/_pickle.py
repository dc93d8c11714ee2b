"""Unpickling with an allow-list of plain data.

Atlas blocks, Modalities indexes and MDS ``pkl`` columns are pickles. ``pickle.loads`` on a
file from elsewhere runs whatever code the file names; :func:`safe_loads` instead refuses every
global that is not plain data and raises :class:`~lmdata.errors.UnsafeDataError` naming it,
before anything runs. ``allow_unsafe=True`` trusts the file and uses ``pickle.loads``.
"""

from __future__ import annotations

import functools
import gc
import importlib
import io
import pickle
import reprlib
import sys
from typing import Any

from lmdata._native import load
from lmdata.errors import CorruptDataError, UnsafeDataError

# Globals a pickle of plain data refers to. Built-in containers and scalars need no global at
# all (they have opcodes); these are the ones protocol 2-5 pickles of sets, complex numbers,
# bytearrays, numpy arrays and numpy scalars name.
_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "complex"),
        ("builtins", "slice"),
        ("__builtin__", "set"),
        ("__builtin__", "frozenset"),
        ("__builtin__", "complex"),
        ("copy_reg", "_reconstructor"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
    }
)


def _no_int_size(factory: type) -> Any:
    """bytes/bytearray as pickles use them; ``bytes(10**12)`` would allocate, so an int
    argument (which no pickle of plain data contains) is refused."""

    def make(*args: Any) -> Any:
        if args and isinstance(args[0], int):
            raise UnsafeDataError(f"pickle calls {factory.__name__}(int), an unbounded allocation")
        if len(args) > 1 and args[1:] != ("latin-1",) and args[1:] != ("latin1",):
            # bytearray pickles of protocol < 3 pass (str, 'latin-1'); another codec can cost
            # far more than its input (punycode is quadratic)
            raise UnsafeDataError(
                f"pickle calls {factory.__name__}{describe(args)}; plain data uses latin-1"
            )
        return factory(*args)

    return make


def _reconstruct(cls: Any, shape: Any, dtype: Any) -> Any:
    """numpy's array reconstructor, refusing a pre-sized array: a real pickle always passes an
    empty shape and then fills the array from bytes it carries, so a large shape here is an
    allocation the file does not pay for."""
    import numpy as np

    try:
        n = int(np.prod(shape, dtype=np.int64)) if shape is not None else 0
    except (TypeError, ValueError, OverflowError):
        raise UnsafeDataError(f"array pickle with an invalid shape {shape!r}") from None
    if cls is not np.ndarray or not 0 <= n <= 1024:
        raise UnsafeDataError(f"array pickle asks for {n} preallocated items; refusing")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _latin1(*args: Any) -> Any:
    """``_codecs.encode`` as protocol 0-2 pickles of bytes call it, ``(str, 'latin1')``; any
    other codec is refused: some cost far more than their input (punycode is quadratic: a
    pickle of 100 KB would run for half an hour)."""
    if len(args) != 2 or type(args[0]) is not str or args[1] not in ("latin1", "latin-1"):
        raise UnsafeDataError(
            f"pickle calls _codecs.encode{describe(args)}; plain data only encodes as latin1"
        )
    return args[0].encode("latin1")


_FACTORIES: dict[tuple[str, str], Any] = {
    (mod, t.__name__): _no_int_size(t)
    for mod in ("builtins", "__builtin__")
    for t in (bytes, bytearray)
}
_FACTORIES.update(
    {
        (mod, "_reconstruct"): _reconstruct
        for mod in ("numpy.core.multiarray", "numpy._core.multiarray")
    }
)
_FACTORIES[("_codecs", "encode")] = _latin1  # protocol < 3 spells bytes so


def _scalar(module: str) -> Any:
    """numpy's scalar reconstructor as numpy's pickles call it, with the scalar's bytes (or
    object): called without them it allocates and zeroes the dtype's itemsize, which a pickle
    of a few bytes sets to gigabytes (``dtype('V800000000')``)."""

    def make(*args: Any) -> Any:
        if len(args) != 2:
            raise UnsafeDataError(
                f"pickle calls numpy's scalar with {len(args)} argument(s), not the dtype and "
                "its bytes: an allocation the file does not pay for"
            )
        return importlib.import_module(module).scalar(*args)

    return make


_FACTORIES.update(
    {(mod, "scalar"): _scalar(mod) for mod in ("numpy.core.multiarray", "numpy._core.multiarray")}
)


# How far each opcode's argument reaches, for the memo check below: n > 0 is the whole opcode's
# length; the negative codes name argument kinds. tests/test_pickle.py checks the table against
# pickletools' opcode list. 0 (unknown opcode) ends the walk: the unpickler reports it.
_COUNT1, _COUNT4, _COUNT8, _LINE, _PUT, _LONG_BINPUT, _TWO_LINES, _STOP = range(-1, -9, -1)


def _opcode_table() -> list[int]:
    table = [0] * 256
    for c in b"()012NQRSabdelostu}]\x81\x85\x86\x87\x88\x89\x90\x91\x92\x8f\x93\x94\x97\x98":
        table[c] = 1
    for c, n in zip(
        b"KMJGqhj\x80\x82\x83\x84\x95", (1, 2, 4, 8, 1, 1, 4, 1, 1, 2, 4, 8), strict=True
    ):
        table[c] = 1 + n
    for codes, kind in (
        (b"UC\x8c\x8a", _COUNT1),
        (b"TBX\x8b", _COUNT4),
        (b"\x8d\x8e\x96", _COUNT8),
        (b"ILFSVgP", _LINE),
        (b"p", _PUT),
        (b"r", _LONG_BINPUT),
        (b"ci", _TWO_LINES),
        (b".", _STOP),
    ):
        for c in codes:
            table[c] = kind
    return table


_OPCODES = _opcode_table()
_TABLE = bytes(k & 0xFF for k in _OPCODES)  # the same table for the C walk

# the walk in C (lmdata/_native/memowalk.c); None: the Python walk does it (same answers)
_memowalk = load("memowalk")
_c_item_pickle = getattr(_memowalk, "item_pickle", None)  # load_item; None: always whole
_c_early_slot = getattr(_memowalk, "early_slot", None)
_c_early_slots = getattr(_memowalk, "early_slots", None)
_c_block_index = getattr(_memowalk, "block_index", None)
_c_item_at = getattr(_memowalk, "item_at", None)
_loads = pickle.loads
NOT_ALONE = object()  # load_indexed: the item cannot be had alone (unpickle the list whole)


# bytes of the opcodes the walk refuses: PUT, LONG_BINPUT, and the 4/8-byte counted strings
_WALK_FOR = (b"r", b"p", b"B", b"X", b"\x8d", b"\x8e")


def _check_memo_indices(data: bytes, where: str) -> None:
    """Refuse a pickle that stores into a memo slot it could not have filled.

    CPython's unpickler grows its memo to twice the largest index a PUT or LONG_BINPUT names
    and zeroes it: a 10-byte pickle naming slot 10**9 writes 16 GB. A real pickle names slots
    in order, so an index is never beyond the opcode's offset; this walk (opcodes only, string
    payloads skipped) checks that before the C unpickler runs, and that no 4- or 8-byte string
    count reaches beyond the data (Python 3.11 allocates the count before reading). In C
    (``_native/memowalk.c``) it costs about a tenth of the unpickling; the Python walk it falls back
    to (no compiler at install, or a text-protocol opcode) costs 1-3x. It is skipped on
    Pythons whose unpickler has the fix, and ``allow_unsafe=True`` (a trusted file) skips it
    too."""
    if _sparse_memo() or not any(c in data for c in _WALK_FOR):
        return  # this Python cannot be made to allocate so; or no opcode that could
    slot, at = _early_slot(data)
    if slot == _TOO_LONG:
        _refuse_count(at, where)
    if slot:
        _refuse_slot(slot, at, where)


_TOO_LONG = -2  # the walks' slot answer for a string or bytes count beyond the data


def _refuse_count(at: int, where: str) -> None:
    raise CorruptDataError(
        f"pickle's string or bytes at byte {at} claims more bytes than the data holds "
        "(truncated or damaged); refusing before the unpickler allocates that count",
        position=where or None,
    )


def _refuse_slot(slot: int, at: int, where: str) -> None:
    raise UnsafeDataError(
        f"pickle stores into memo slot {slot} at byte {at}, which would allocate memory "
        "the file does not justify; refusing",
        position=where or None,
    )


def memo_check_needed() -> bool:
    """Whether :func:`safe_loads` walks pickles for memo bombs in Python here (so a caller
    that remembers which bytes passed saves something by passing ``memo_checked=True``; the C
    walk costs less than hashing the bytes to remember them)."""
    return not _sparse_memo() and _c_early_slot is None


@functools.cache
def _sparse_memo() -> bool:
    """Whether this Python's C unpickler keeps a far memo slot without a table up to it
    (CPython's fix of gh-115952). Probed once: storing into slot 65536 grows an unfixed
    unpickler by a 1 MiB table, which ``__sizeof__`` reports; a fixed one stays small."""
    u = pickle.Unpickler(io.BytesIO(b"]r\x00\x00\x01\x00."))
    before = sys.getsizeof(u)
    u.load()
    return sys.getsizeof(u) - before < 65536


def _early_slot(data: bytes) -> tuple[int, int]:
    """(slot, offset) of the first PUT/LONG_BINPUT naming a slot beyond its offset, else (0, 0);
    (-2, offset) of a 4- or 8-byte string/bytes count beyond the data's end (Python 3.11's
    unpickler allocates such a count before reading): the C walk, and the Python walk where it
    stops at a text opcode or was not built."""
    if _c_early_slot is not None:
        slot, at, _ = _c_early_slot(data, _TABLE)
        if slot >= 0:
            return slot, at
    return _py_early_slot(data)


def _py_early_slot(data: bytes) -> tuple[int, int]:
    """:func:`_early_slot` in Python.

    The loop is laid out for speed (a fixed-width opcode goes straight back to the top; the
    end of the data is the IndexError of reading past it): 15-30% faster than with a bounds
    check per opcode, which matters since this runs on every block a reader decodes."""
    i, table, from_bytes = 0, _OPCODES, int.from_bytes
    try:
        while True:
            k = table[data[i]]
            if k > 0:
                i += k
                continue
            if k == _COUNT1:
                i += 2 + data[i + 1]
            elif k == _COUNT4:  # unsigned, as CPython's unpickler reads it
                if i + 5 > len(data):
                    break
                size = from_bytes(data[i + 1 : i + 5], "little")
                if i + 5 + size > len(data):
                    return _TOO_LONG, i
                i += 5 + size
            elif k == _LONG_BINPUT:
                slot = from_bytes(data[i + 1 : i + 5], "little")
                if slot > i:
                    return slot, i
                i += 5
            elif k == _COUNT8:
                if i + 9 > len(data):
                    break
                size = from_bytes(data[i + 1 : i + 9], "little", signed=True)
                if size < 0:
                    break  # 2**63 or more: the unpickler refuses it
                if i + 9 + size > len(data):
                    return _TOO_LONG, i
                i += 9 + size
            elif k == _PUT:
                j = data.index(b"\n", i) + 1
                try:  # the unpickler reads the line as int() does: sign, spaces, 1_000
                    slot = int(data[i + 1 : j - 1])
                except ValueError:
                    slot = 0  # the unpickler refuses it too
                if slot > i:
                    return slot, i
                i = j
            elif k == _LINE:
                i = data.index(b"\n", i) + 1
            elif k == _TWO_LINES:
                i = data.index(b"\n", data.index(b"\n", i) + 1) + 1
            else:  # STOP, or an opcode the unpickler will refuse
                break
    except (IndexError, ValueError):  # the end, or truncated: the unpickler says so
        pass
    return 0, 0


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str) -> None:
        self._file = io.BytesIO(data)
        super().__init__(self._file)
        self._where = where

    def consumed(self) -> int:
        """Bytes read up to the pickle's STOP opcode (valid after ``load``)."""
        return self._file.tell()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if (module, name) in _FACTORIES:
            return _FACTORIES[(module, name)]
        raise UnsafeDataError(
            f"pickle refers to {module}.{name}, which is not plain data; refusing to load it. "
            "If you trust this file, pass allow_unsafe_pickle=True (--allow-unsafe-pickle)",
            position=self._where or None,
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeDataError(
            "pickle uses persistent ids, which plain data never needs", position=self._where
        )


_DESCRIBE = reprlib.Repr()
_DESCRIBE.maxlevel = 4
_DESCRIBE.maxstring = _DESCRIBE.maxother = 40


def describe(obj: Any, limit: int = 80) -> str:
    """A short repr of an unpickled value for error messages: bounded in length and depth.

    ``repr`` of a pickle's result is not safe: a pickle of a few hundred KB can build lists
    nested 100,000 deep (its opcodes are a stack machine, so loading never recurses), and their
    repr would raise RecursionError.
    """
    try:
        text = _DESCRIBE.repr(obj)
    except (RecursionError, Exception):  # an object repr that fails is described by its type
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def safe_loads(
    data: bytes | bytearray | memoryview,
    *,
    where: str = "",
    path: str | None = None,
    allow_unsafe: bool = False,
    memo_checked: bool = False,
) -> Any:
    """Unpickle ``data`` allowing only plain data (or anything when ``allow_unsafe``).

    Any failure is a :class:`CorruptDataError` or :class:`UnsafeDataError` naming ``path`` and
    ``where``; nothing else escapes. Bytes after the pickle's end are ignored, as by
    ``pickle.loads``; :func:`safe_load_prefix` says where it ended. ``memo_checked=True``
    skips the memo-bomb walk for bytes equal to ones that passed it before (the allow-list
    still applies).
    """
    return safe_load_prefix(
        data, where=where, path=path, allow_unsafe=allow_unsafe, memo_checked=memo_checked
    )[0]


def safe_load_prefix(
    data: bytes | bytearray | memoryview,
    *,
    where: str = "",
    path: str | None = None,
    allow_unsafe: bool = False,
    memo_checked: bool = False,
) -> tuple[Any, int]:
    """(value, number of bytes the pickle took) of the pickle at the start of ``data``."""
    try:
        if allow_unsafe:
            f = io.BytesIO(bytes(data))
            return pickle.Unpickler(f).load(), f.tell()
        raw = bytes(data)
        if _c_early_slot is not None and not memo_checked and not _sparse_memo():
            slot, at, end = _c_early_slot(raw, _TABLE)
            if slot > 0:
                _refuse_slot(slot, at, where)
            if slot == _TOO_LONG:
                _refuse_count(at, where)
            if slot == 0 and end > 0:
                # Walked to STOP and no opcode names or calls code: nothing for the allow-list
                # to refuse, and pickle.loads skips the file object and subclass of the
                # unpickler below (5-10% of a block of small dicts).
                return pickle.loads(raw), end
            if slot < 0:  # a text opcode: the Python walk
                _check_memo_indices(raw, where)
        elif not memo_checked:
            _check_memo_indices(raw, where)
        u = _SafeUnpickler(raw, where)
        return u.load(), u.consumed()
    except UnsafeDataError as e:
        if path is not None and e.path is None:
            raise UnsafeDataError(
                str(e).removeprefix(f"{where}: "), path=path, position=where or None
            ) from None
        raise
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        LookupError,  # IndexError, KeyError, and _codecs.encode's unknown encoding
        MemoryError,
        OverflowError,
        ImportError,
        UnicodeError,
    ) as e:
        raise CorruptDataError(
            f"cannot unpickle: {type(e).__name__}: {e}", path=path, position=where or None
        ) from None


def walk_all(buffers: Any) -> memoryview | None:
    """The C walk's (slot, offset, end) of each of ``buffers`` (a sequence of bytes-like
    objects), as int64s, walked without the GIL (so that a thread walks blocks while another
    runs Python); None where the C walk was not built."""
    if _c_early_slots is None:
        return None
    return memoryview(_c_early_slots(buffers, _TABLE)).cast("q")


def load_list(
    data: bytes | memoryview, count: int, walked: tuple[int, int, int] | None = None
) -> list[Any] | None:
    """The pickled list ``data`` of ``count`` items where the C walk vouches for it (no memo
    write beyond its offset, no opcode that names or calls code: plain values whatever loads
    it), unpickled with the collector paused; else None, and the caller unpickles it with
    :func:`safe_loads`, which reports any problem precisely. The hot path of reading blocks:
    one walk and ``pickle.loads``, without the layers of ``safe_loads``. ``walked``: the walk's
    answer for these very bytes, made earlier (see :func:`walk_all`)."""
    if _c_early_slot is None:
        return None
    slot, _, end = _c_early_slot(data, _TABLE) if walked is None else walked
    if slot or end <= 0:
        return None
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        out = pickle.loads(data)
    except Exception:  # safe_loads says what is wrong
        return None
    finally:
        if paused:
            gc.enable()
    return out if type(out) is list and len(out) == count else None


def items_alone() -> bool:
    """Whether :func:`load_item` can unpickle an item alone here (the C walk was built)."""
    return _c_item_pickle is not None


def load_item(data: bytes, j: int, count: int) -> tuple[bool, Any]:
    """(True, item ``j``) of the pickled list ``data`` of ``count`` items, unpickled on its own;
    (False, None) where the C walk cannot vouch for that (then unpickle the list whole, which
    also reports any damage precisely).

    A reader after one example of a block need not build the other examples: the C walk
    (``item_pickle`` in ``_native/memowalk.c``) follows the whole pickle, checks it is a list of
    ``count`` items made only of plain-data opcodes (no globals, no calls, no memo writes but
    MEMOIZE; so neither the allow-list nor the memo-bomb walk has anything to refuse), and says
    where item ``j`` lies and which earlier strings or numbers it takes from the memo, and
    makes a small pickle of it: those memo slots filled (the rest with None, which it never
    reads), then the item's own opcodes.
    """
    if _c_item_pickle is None:
        return False, None
    got = _c_item_pickle(data, j)
    if got is None or got[0] != count:
        return False, None
    try:
        return True, pickle.loads(got[1])
    except Exception:  # not expected: the whole-list path says what is wrong
        return False, None


def block_index(data: bytes | memoryview, count: int, j: int) -> tuple[bytes, Any] | None:
    """(index, item ``j``): the index :func:`load_indexed` uses for the pickled list ``data``
    of ``count`` items (where each item lies, which earlier memo slots items get), after the
    whole walk :func:`load_item` makes, and item ``j`` through it (NOT_ALONE where it cannot
    be had alone); None where the walk cannot vouch for the list (unpickle it whole). The
    index is a few hundred bytes for a block of examples: a reader keeps it for each block it
    has seen, so a later read of the block walks only the example's own bytes."""
    if _c_block_index is None:
        return None
    got = _c_block_index(data, j)
    if got is None or int.from_bytes(got[0][4:8], sys.byteorder) != count:
        return None
    index, item = got
    if item is None:
        return index, NOT_ALONE
    try:
        return index, _loads(item)
    except Exception:  # not expected: the whole-list path says what is wrong
        return index, NOT_ALONE


def load_indexed(data: bytes | memoryview, index: bytes, j: int) -> Any:
    """Item ``j`` as :func:`load_item` finds it, from the list's :func:`block_index` (made from
    these very bytes; other bytes or a damaged index give plain values or NOT_ALONE, never a
    global, a call or a memo write). NOT_ALONE rather than a (found, item) pair: this runs
    once per random read."""
    got = _c_item_at(data, j, index)  # type: ignore[misc]
    if got is None:
        return NOT_ALONE
    try:
        return _loads(got)
    except Exception:  # not expected: the whole-list path says what is wrong
        return NOT_ALONE
