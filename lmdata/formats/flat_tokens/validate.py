"""Every invariant of the flat-tokens spec, checked chunk by chunk, reported with its place."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from lmdata._progress import OnProgress, Ticker
from lmdata._report import MAX_REPORTED, ProblemReport
from lmdata.errors import LmdataError
from lmdata.formats.flat_tokens._zarr import ZArray, node_attrs, node_kind, read_json
from lmdata.formats.flat_tokens._zarr_meta import parse_array
from lmdata.formats.flat_tokens.reader import MAX_TOKEN_ID, SPLITS, find_token_array
from lmdata.storage import Store, basename, join, resolve

# seq_starts entries that may read as the fill value for want of a chunk file (64 MiB of u64)
MAX_UNWRITTEN = 1 << 23


def validate(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
) -> list[str]:
    """All problems found in the dataset at ``path`` (empty when it is valid); ``progress``
    counts the bytes of the arrays (seq_starts, then token chunk by chunk)."""
    store, key = resolve(path, storage_options)
    root = store.url(key)
    rep = ProblemReport()
    if not store.is_dir(key):
        return [f"{root}: not a directory"]
    try:
        kind = node_kind(store, key)
    except LmdataError as e:
        return [str(e)]
    try:
        if find_token_array(store, key) is not None:
            tick = Ticker(progress, _split_bytes(store, key), "validate")
            _check_split(store, key, basename(key), rep, tick)
            return rep.finish()
    except LmdataError as e:
        return [str(e)]
    if kind is None or kind[1] != "group":
        rep.add("root", f"{root}: not a zarr group (no .zgroup or zarr.json)")
    _check_zgroup(store, key, rep)
    present = [s for s in SPLITS if store.is_dir(join(key, s))]
    tick = Ticker(progress, sum(_split_bytes(store, join(key, s)) for s in present), "validate")
    for split in SPLITS:
        if split not in present:
            rep.add("split", f"{split}: missing (a flat-tokens dataset has train and validation)")
            continue
        try:
            _check_split(store, join(key, split), split, rep, tick)
        except LmdataError as e:  # metadata too broken to look further into this split
            rep.add("split", f"{split}: {e}")
    return rep.finish()


def _split_bytes(store: Store, d: str) -> int:
    """The bytes of a split's two arrays, from their metadata (0 where it is unreadable: the
    check reports that)."""
    total = 0
    try:
        arrays = [find_token_array(store, d), join(d, "seq_starts")]
    except LmdataError:
        return 0
    for a in arrays:
        try:
            arr = ZArray(store, a, cache_bytes=0) if a is not None else None
        except LmdataError:
            continue
        if arr is not None:
            total += len(arr) * arr.meta.dtype.itemsize
    return total


def _sorted_unique(a: np.ndarray, ordered: bool) -> np.ndarray:
    """``np.unique(a)`` as int64, for starts that are ``ordered`` (never decreasing: then the
    starts of non-empty sequences are strictly increasing already) or not. Not ``np.unique``
    itself: it imports ``numpy.ma``, a third of a cold ``validate``."""
    a = a.astype(np.int64)
    if ordered:
        return a
    a.sort()
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def _check_zgroup(store: Store, d: str, rep: ProblemReport) -> None:
    """A v2 group's ``.zgroup`` must say ``zarr_format`` 2 (zarr-python refuses it otherwise;
    lmdata itself needs only its presence)."""
    if ".zgroup" not in store.list(d):
        return
    f = join(d, ".zgroup")
    try:
        fmt = read_json(store, f).get("zarr_format")
    except LmdataError as e:
        rep.add("group", str(e))
        return
    if fmt != 2:
        rep.add("group", f"{store.url(f)}: zarr_format is {fmt!r}, must be 2")


def _check_raw_sizes(
    store: Store, arr: ZArray, name: str, rep: ProblemReport
) -> set[tuple[str, int]]:
    """Each chunk file of an uncompressed array must hold a whole chunk: zarr writes the last
    one padded to full size too, and zarr-python refuses any other size. A shorter file was
    cut short (lmdata's reader refuses it only where it lacks items the array holds, so the
    padding of the last chunk would pass unseen), a longer one written by something else.
    Returns the (array, chunk) of each such file."""
    meta, dec = parse_array(store, arr.key)
    if dec.decode is not None or meta.shard_inner:
        return set()
    full = meta.chunk_len * meta.dtype.itemsize
    bad = set()
    for k in arr.present_chunks():
        try:
            size = arr.chunk_size(k)
        except FileNotFoundError:  # gone since the listing
            continue
        if size != full:
            bad.add((arr.key, k))
            rep.add(
                "chunk",
                f"{name}: chunk {k} ({store.url(arr.chunk_key(k))}) has {size:,} bytes; an "
                f"uncompressed chunk has {full:,} ({meta.chunk_len:,} items of "
                f"{meta.dtype.itemsize} bytes, the last one padded): "
                f"{'cut short' if size < full else 'written by something else'}?",
            )
    return bad


def _check_split(store: Store, d: str, split: str, rep: ProblemReport, tick: Ticker) -> None:
    _check_zgroup(store, d, rep)
    try:
        attrs = node_attrs(store, d)
    except LmdataError as e:
        rep.add("attrs", f"{split}: {e}")
        attrs = {}
    max_id = attrs.get("max_token_id")
    if max_id is None:
        rep.add("attrs", f"{split}: attribute max_token_id is missing")
    elif not isinstance(max_id, int) or isinstance(max_id, bool) or not 0 <= max_id <= MAX_TOKEN_ID:
        rep.add("attrs", f"{split}: max_token_id {max_id!r} is not an integer in [0, 2^31-1]")
        max_id = None
    tok_dir = find_token_array(store, d)
    if tok_dir is None:
        rep.add("array", f"{split}/encoded_tokens: missing")
        return
    tok_name = basename(tok_dir)
    try:
        tokens = ZArray(store, tok_dir, cache_bytes=0)
    except LmdataError as e:
        rep.add("array", f"{split}/{tok_name}: {e}")
        return
    try:
        starts = ZArray(store, join(d, "seq_starts"), cache_bytes=0)
    except LmdataError as e:
        rep.add("array", f"{split}/seq_starts: {e}")
        return
    short = _check_raw_sizes(store, starts, f"{split}/seq_starts", rep)
    short |= _check_raw_sizes(store, tokens, f"{split}/{tok_name}", rep)
    if tokens.meta.dtype != np.dtype("<u4"):
        rep.add("dtype", f"{split}/{tok_name}: dtype {tokens.meta.dtype} (the spec says uint32)")
    if starts.meta.dtype != np.dtype("<u8"):
        rep.add("dtype", f"{split}/seq_starts: dtype {starts.meta.dtype} (the spec says uint64)")
    n_tok = len(tokens)
    # A chunk never written reads as the fill value (seqax leaves the only chunk of an empty
    # split unwritten): judge the values, but do not conjure up more than a real array holds.
    present = starts.present_chunks()
    unwritten = 0
    if len(present) < starts.nchunks:
        have = set(present)
        unwritten = len(starts) - sum(
            min(starts.meta.chunk_len, len(starts) - k * starts.meta.chunk_len) for k in have
        )
        if unwritten > MAX_UNWRITTEN:
            rep.add(
                "array",
                f"{split}/seq_starts: declares {starts.nchunks} chunks but only {len(present)} "
                f"chunk files exist; the other {unwritten} entries would all read as the fill "
                f"value {starts.meta.fill_value} (the dataset is incomplete)",
            )
            return
    try:
        ss = starts.read(0, len(starts)).astype(np.uint64)
    except LmdataError as e:
        rep.add("read", f"{split}/seq_starts: {e}")
        return
    tick.add(len(ss) * starts.meta.dtype.itemsize)
    sname = f"{split}/seq_starts"
    if len(ss) == 0:
        rep.add("starts", f"{sname}: empty (must start with 0 and end with {n_tok})")
        return
    if ss[0] != 0:
        rep.add("starts", f"{sname}[0]: is {int(ss[0])}, must be 0")
    if ss[-1] != n_tok:
        rep.add(
            "starts",
            f"{sname}[{len(ss) - 1}]: last entry is {int(ss[-1])}, must equal "
            f"the token count {n_tok}",
        )
    if unwritten and (ss[0] != 0 or ss[-1] != n_tok or (ss[1:] < ss[:-1]).any()):
        missing = sorted(set(range(min(starts.nchunks, 1 << 16))) - set(present))
        rep.add(
            "starts",
            f"{sname}: chunks {missing[:MAX_REPORTED]} have no file and read as the fill value "
            f"{starts.meta.fill_value}; the problems below may come from their absence",
        )
    dec = np.nonzero(ss[1:] < ss[:-1])[0]
    for i in dec[:MAX_REPORTED]:
        rep.add(
            "order",
            f"{sname}[{i + 1}]: {int(ss[i + 1])} is less than the entry before "
            f"it, {int(ss[i])} (seq_starts must never decrease)",
        )
    rep.count("order", max(0, len(dec) - MAX_REPORTED))
    # the positions that must carry a start bit: starts of non-empty sequences
    nonempty = ss[:-1][ss[1:] > ss[:-1]]
    expected = _sorted_unique(nonempty[nonempty < n_tok], ordered=len(dec) == 0)
    tname = f"{split}/{tok_name}"
    unit = tokens.unit
    n_units = -(-n_tok // unit) if unit else 0
    present = tokens.present_units()
    if len(present) < n_units:
        have = set(present)
        first = [u for u in range(min(n_units, len(present) + MAX_REPORTED + 1)) if u not in have]
        rep.add(
            "missing",
            f"{tname}: {n_units - len(present)} of {n_units} chunks have no file (they read as "
            f"fill value {tokens.meta.fill_value}); first missing: {first[:MAX_REPORTED]}",
        )
    width = tokens.meta.dtype.itemsize
    for u in present:
        if (tokens.key, u) in short:  # (its size is reported; reading it would say so again)
            continue
        lo, hi = u * unit, min((u + 1) * unit, n_tok)
        tick.add((hi - lo) * width)
        try:
            chunk = tokens.read(lo, hi)
        except LmdataError as e:
            rep.add("read", f"{tname}: {e}")
            continue
        bits = np.nonzero(chunk & 1)[0] + lo
        want = expected[np.searchsorted(expected, lo) : np.searchsorted(expected, hi)]
        if not np.array_equal(bits, want):
            extra = np.setdiff1d(bits, want)
            missing = np.setdiff1d(want, bits)
            for i in extra[:MAX_REPORTED]:
                rep.add("bits", f"{tname}[{i}]: has a start bit but no sequence starts there")
            for i in missing[:MAX_REPORTED]:
                rep.add("bits", f"{tname}[{i}]: a sequence starts here but the start bit is 0")
        if max_id is not None and len(chunk):
            ids = chunk >> 1
            over = np.nonzero(ids > max_id)[0]
            for i in over[:MAX_REPORTED]:
                rep.add(
                    "ids",
                    f"{tname}[{lo + i}]: token id {int(ids[i])} is greater than "
                    f"max_token_id {max_id}",
                )
