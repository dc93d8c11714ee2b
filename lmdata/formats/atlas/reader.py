"""Reading Atlas datasets (torch-atlas-ds) as a records reader.

Fixes over the origin's reader: positional reads through the store (``pread`` locally), so
workers forked after the parent has read get correct examples; an allow-list unpickler unless
the file is trusted; a bound on the decompressed size of a block; a block cache (see
:mod:`.blocks`) that never hands the same object out twice; correct negative indices; ``take``
that decodes each needed block once; reading ahead when ``r[i]`` goes in order, with the next
blocks decompressed on a background thread (see :mod:`.ahead`).
"""

from __future__ import annotations

import copy
import os
import threading
import weakref
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import numpy as np
import zstandard

from lmdata._pickle import (
    NOT_ALONE,
    block_index,
    items_alone,
    load_indexed,
    load_list,
    memo_check_needed,
)
from lmdata.errors import DatasetNotFoundError, FormatError
from lmdata.formats.atlas import codec
from lmdata.formats.atlas.ahead import (
    RAW_AHEAD,
    Decoder,
    Run,
    Stream,
    ahead_budget,
    frame_sizes,
)
from lmdata.formats.atlas.blocks import (
    INDEXES,
    KEEP_RATE,
    MAX_HOT,
    TAKEN,
    Checked,
    Hot,
    PerThread,
    Reuse,
    keep_index,
    pickle_block,
    pickle_one,
    unpickle,
)
from lmdata.formats.atlas.meta import DATA, find_shards
from lmdata.formats.atlas.shardfiles import ShardFiles
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import new_slot, resolve

DEFAULT_CACHE_BYTES = 64 << 20  # pickled examples of earlier blocks kept for later reads
MAX_OPEN_FILES = 64
_AHEAD_SHARDS = 4  # a thread reads ahead in at most this many shards (sharing its budget)
_AHEAD_BLOCKS = 1024  # blocks per read ahead at most
_SAMPLE = 3  # a mask of the random look-up count: Reuse hears of one in four
# Forks of this process so far (in the child): a reader compares it with its own instead of
# calling os.getpid() per read, a system call of about 0.2 µs.
_FORKS = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


class Atlas(ShardFiles):
    """An Atlas dataset as records: ``len``, ``r[i]``, ``r.take(indices)``, iteration.

    Each example is returned exactly as it was pickled (dicts for JSON-like data), and a fresh
    object every time, so changing it never changes later reads. ``allow_unsafe_pickle=True``
    trusts the file (any pickle); ``max_block_bytes`` bounds one decompressed block;
    ``cache_bytes`` bounds the examples of earlier blocks kept between reads (as pickles; each
    thread's current block of every shard is kept decoded regardless, see :mod:`.blocks`);
    ``ahead_bytes`` bounds the blocks decompressed ahead of each thread reading in order and
    of each iteration (default 4 MiB, 0 with one CPU; 0 turns it off; a block larger than
    its share still goes ahead whole; see :func:`.ahead.ahead_budget`).
    ``compression_dict`` gives the shared dictionary's bytes (a shard opened on its own, away
    from its dataset root).
    """

    format = "atlas"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        allow_unsafe_pickle: bool = False,
        max_block_bytes: int = codec.MAX_BLOCK_BYTES,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        ahead_bytes: int | None = None,
        compression_dict: bytes | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.store, key = resolve(path, storage_options)
        self.store.snapshot(key)  # what is read later is what is there now (one listing)
        self.root: PurePath = (
            Path(key) if self.store.local_path(key) is not None else PurePosixPath(key)
        )
        if not self.store.exists(key):
            raise DatasetNotFoundError("no such file or directory", path=self.store.url(key))
        self.compression_dict = None if compression_dict is None else bytes(compression_dict)
        if not self.store.is_dir(key):
            raise FormatError(
                "an Atlas dataset is a folder with meta.json", path=self.store.url(key)
            )
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.max_block_bytes = max_block_bytes
        self.cache_bytes = cache_bytes
        ahead_budget(ahead_bytes)  # checked here, resolved per process (its CPUs)
        self.ahead_bytes = ahead_bytes
        self.meta, self.shards, self._dict_dir = find_shards(self.root, self.store)
        sizes = np.array([s.meta.stored_examples for s in self.shards], dtype=np.int64)
        # The origin's rule: shard sizes come from each shard's meta, not the root's list.
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - sizes
        self._len = int(self._ends[-1]) if len(sizes) else 0
        self._derive()
        self._reset()

    def _derive(self) -> None:
        """Plain-Python per-shard tables for the per-example hot path."""
        self._ends_list: list[int] = self._ends.tolist()
        self._starts_list: list[int] = self._starts.tolist()
        self._block_sizes = [sh.meta.block_size for sh in self.shards]
        self._block_sizes_arr = np.asarray(self._block_sizes, dtype=np.int64)  # for take()
        self._names = [sh.folder.name for sh in self.shards]
        self._data_paths = [str(sh.folder / DATA) for sh in self.shards]

    # ---- per-process state (dropped when pickled, rebuilt after fork) ----------------------

    def _reset(self) -> None:
        self._forks = _FORKS[0]  # (no register_at_fork: no fork either)
        self._lock = threading.Lock()
        self._local = PerThread()
        self._sizes: dict[int, int] = {}  # shard -> bytes in data.bin
        self._index: dict[int, np.ndarray] = {}
        self._offsets: dict[int, tuple[list[int], int]] = {}  # shard -> (index as ints, size)
        self._dicts: dict[Any, zstandard.ZstdCompressionDict] = {}
        self._codecs: dict[int, tuple[bool, int, str | None]] = {}
        # examples of blocks read before, one pickle each, in the process-wide byte cache (the
        # decoded blocks ahead of reads in order are apart: ahead_bytes)
        self._ahead_bytes = ahead_budget(self.ahead_bytes)
        self._slot = new_slot(self.cache_bytes)
        self._reuse = Reuse(self.cache_bytes)
        self._tick = 0  # random look-ups, for sampling them into Reuse
        self._decoder: Decoder | None = None  # started by the first read in order
        self._decoder_dctx: dict[Any, zstandard.ZstdDecompressor] = {}  # its decompressors
        self._ratio = 4.0  # pickled / stored bytes of blocks, learnt from runs read ahead
        self._checked = Checked(not self.allow_unsafe_pickle and memo_check_needed())
        # shards read whole at random: all of them without the C walk; else those whose
        # examples the walk could not vouch for
        self._whole: set[int] = set() if items_alone() else set(range(len(self.shards)))

    def _check_pid(self) -> None:
        if self._forks != _FORKS[0]:
            # Locks held by another thread at fork time would stay held: rebuild everything
            # (the store opens its own files in this process).
            self._reset()

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "store",
            "root",
            "allow_unsafe_pickle",
            "max_block_bytes",
            "cache_bytes",
            "ahead_bytes",
            "compression_dict",
            "meta",
            "shards",
            "_dict_dir",
            "_ends",
            "_starts",
            "_len",
        )
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derive()
        self._reset()

    def info(self) -> dict[str, Any]:
        """Examples and shards of this reader (the dataset's full summary: ``lmdata.info``)."""
        return {"examples": len(self), "shards": len(self.shards)}

    def close(self) -> None:
        """Close open files and drop caches; the reader reopens them if used again."""
        with self._lock:
            self._sizes.clear()
            self._slot.clear()
            self._index.clear()
            self._offsets.clear()
            self._local = PerThread()  # every thread's decoded blocks go with it
            if self._decoder is not None:
                self._decoder.stop()
                self._decoder = None

    @property
    def _cached_bytes(self) -> int:
        """Decoded bytes this reader holds in the shared cache."""
        return self._slot.nbytes

    def __enter__(self) -> Atlas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Atlas({str(self.root)!r}, examples={self._len}, shards={len(self.shards)})"

    # ---- low-level access ------------------------------------------------------------------

    def _decode_raw(
        self,
        s: int,
        b: int,
        raw: bytes,
        plain: bytes | memoryview | None = None,
        walked: tuple[int, int, int] | None = None,
    ) -> tuple[list[Any], int]:
        """(examples, pickled size) of block ``b`` of shard ``s`` from its stored bytes (and
        its pickled bytes and their memo walk, where decompressed ahead)."""
        if plain is None:
            plain, walked = self._pickled(s, b, raw), None
        if not self._checked.active:
            items = load_list(plain, self.shards[s].meta.block_len(b), walked)
            if items is not None:
                return items, len(plain)
        seen = self._checked.digest(s, raw)
        items = self._unpickle(s, b, plain, seen in self._checked)
        self._checked.add(seen)
        return items, len(plain)

    def _unpickle(self, s: int, b: int, plain: bytes, memo_checked: bool = False) -> list[Any]:
        """The examples of block ``b`` of shard ``s`` from its pickled bytes."""
        return codec.unpickle_block(
            plain,
            self.shards[s].meta.block_len(b),
            self._where(s, b),
            self._shown(self._data_paths[s]),
            self.allow_unsafe_pickle,
            memo_checked=memo_checked,
        )

    def _read_block(self, s: int, b: int) -> tuple[list[Any], int]:
        """(examples, pickled size) of block ``b`` of shard ``s``."""
        return self._decode_raw(s, b, self._read_raw(s, b))

    def _raw(self, s: int, b: int, in_order: bool) -> tuple[Any, ...]:
        """(stored bytes[, pickled bytes or None, their memo walk or None]) of block ``b`` of
        shard ``s``: from this thread's stream of the shard, or a new stream when reads go in
        order (block ``b`` is read on its own while the next ones are read and decompressed
        ahead; the thread's streams share its budget, but those done with their shard, and
        let go of the runs past a shrunk share), or one ranged read."""
        ahead = self._local.ahead
        st = ahead.get(s)
        if st is not None:
            got = st.get(b)
            if got is not None:
                return got
            del ahead[s]
            st.drop()
        if in_order:
            st = ahead[s] = self._stream(s, b + 1, 0)
            if len(ahead) > _AHEAD_SHARDS:
                ahead.popitem(last=False)[1].drop()
            # streams at their shard's end holding nothing read nothing more: the others share
            # the budget, and let go of the runs past their new share
            live = [o for o in ahead.values() if not (o.ended and not o.holding)]
            share = self._ahead_bytes // len(live)
            for other in live:
                other.budget = share if other.decoding else 0
                other.trim()
            st.fill()
        return (self._read_raw(s, b),)

    def _stream(self, s: int, first: int, budget: int) -> Stream:
        """Shard ``s`` read in order from block ``first``, decompressing up to ``budget``
        bytes ahead (stored blocks: read ahead only)."""
        return Stream(lambda b, size: self._run(s, b, size), first, budget, self._codec(s)[0])

    def _run(self, s: int, b: int, decoded: int) -> Run | None:
        """Blocks b, b+1, ... of shard ``s`` in one read: about ``decoded`` bytes of them once
        decompressed, handed to the decoder thread (about RAW_AHEAD stored bytes when 0); None
        past the shard's end or where the index looks damaged (the one-block read says
        precisely how)."""
        n = self.shards[s].meta.num_blocks
        if b >= n:
            return None
        offsets, size = self._shard_offsets(s)
        want = int(decoded / self._ratio) if decoded else RAW_AHEAD
        last = min(n, b + _AHEAD_BLOCKS)
        e = max(b + 1, bisect_right(offsets, offsets[b] + want, b, last + 1) - 1)
        offs = offsets[b : e + 1]
        if not self._one_read(offs, size):
            return None
        start, stop = offs[0], offs[-1]
        buf = self.store.read_range(self._data_paths[s], start, stop - start)
        if len(buf) != stop - start:
            return None
        run = Run(b, offs, buf)
        if decoded:
            _, dict_id, _ = self._codec(s)
            k, total, sizes = frame_sizes(buf, offs, self.max_block_bytes, dict_id, decoded)
            if k:
                run.offs = offs[: k + 1]
                self._ratio = max(1.0, total / (run.offs[-1] - run.offs[0] or 1))
                run.decoded = total
                decoder = self._decoder_for(s)
                if decoder is None or not decoder[0].submit(run, decoder[1], sizes):
                    run.decoded = 0
        return run

    def _decoder_for(self, s: int) -> tuple[Decoder, zstandard.ZstdDecompressor] | None:
        """This reader's decoder thread (started once per process) and a decompressor of
        shard ``s``'s dictionary for it (the thread's own: they are not thread-safe); None
        where the dictionary is unusable (each block's read then says so)."""
        with self._lock:
            if self._decoder is None or self._decoder.pid != os.getpid():
                self._decoder = Decoder()
                self._decoder_dctx.clear()
                weakref.finalize(self, self._decoder.stop)
            dctx = self._decoder_dctx.get(s)
            if dctx is None:
                d = self._dict_for(s)
                key = ("dict", None if d is None else id(d))
                dctx = self._decoder_dctx.get(key)
                if dctx is None:
                    try:
                        dctx = zstandard.ZstdDecompressor(dict_data=d)
                    except zstandard.ZstdError:
                        return None
                self._decoder_dctx[key] = self._decoder_dctx[s] = dctx
            return self._decoder, dctx

    def _one_read(self, offs: list[int], size: int) -> bool:
        """Whether the blocks between index offsets ``offs`` lie in data.bin (of ``size``
        bytes), in order and within max_block_bytes, so one read fetches them all; where not,
        the one-block read says precisely what is wrong."""
        bound = self.max_block_bytes
        return (
            0 <= offs[0]
            and offs[-1] <= size
            and all(0 <= y - x <= bound for x, y in pairwise(offs))
        )

    def _cached(self, key: tuple[int, int]) -> list[bytes | None] | bytes | None:
        """The cache's pickles of a block's examples, or the block's pickled bytes (kept by
        :meth:`_alone`), noting the look-up for :class:`Reuse`."""
        pickled = self._slot.peek(key)
        with self._lock:
            self._reuse.note(key, pickled is not None)
        return pickled  # type: ignore[no-any-return]

    def _keeping(self) -> bool:
        """Whether blocks are worth pickling into the cache now."""
        return self._slot.cap != 0 and self._reuse.worth_keeping  # (cache less read-ahead)

    def _make_hot(self, s: int, h: Hot) -> None:
        """Make ``h`` this thread's block of shard ``s``; the one it replaces is retired."""
        hot = self._local.hot
        old = hot.pop(s, None)
        hot[s] = h
        if old is not None:
            self._retire(s, old)
        if len(hot) > MAX_HOT:
            s0, h0 = hot.popitem(last=False)
            self._retire(s0, h0)

    def _retire(self, s: int, h: Hot) -> None:
        """Keep what is left of a block in the cache as pickles, when blocks are worth it."""
        if self._keeping() and (h.kept or any(x is not TAKEN for x in h.items)):
            pickled, nbytes = pickle_block(h.items, h.kept)
            if nbytes:
                self._slot.put((s, h.block), pickled, nbytes)

    # ---- the Records protocol --------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        if type(index) is int:  # the block this thread read last: a list lookup
            lo, n, items = self._local.last
            j = index - lo
            if 0 <= j < n:
                item = items[j]
                if item is not TAKEN:
                    items[j] = TAKEN
                    return item
        return self._get(index)

    def _get(self, index: int) -> Any:
        if self._forks != _FORKS[0]:
            self._reset()  # see _check_pid
        # The random read's path is spelled out (each call or lookup saved is 1-3% of it).
        if type(index) is int and 0 <= index < self._len:
            i = index
        else:
            i = normalize_index(index, self._len)
        s = bisect_right(self._ends_list, i)
        b, j = divmod(i - self._starts_list[s], self._block_sizes[s])
        loc = self._local
        h = loc.hot.get(s)
        if h is not None and h.block == b and h.items[j] is not TAKEN:
            loc.last = (h.lo, len(h.items), h.items)
            return self[i]
        # Reading on from the previous block into this one's first example: decode it from the
        # read-ahead, skipping the cache (unpickling a block's kept examples one by one costs
        # as much as decoding it) and the reuse bookkeeping, which is about coming back.
        in_order = j == 0 and h is not None and h.block == b - 1
        if not in_order:
            if loc.ahead:
                st = loc.ahead.pop(s, None)  # reads at random: no more blocks ahead
                if st is not None:
                    st.drop()
            key = (s, b)
            cached = self._slot.peek(key)
            tick = self._tick = self._tick + 1  # (threads may lose a tick: a sample's less)
            if not tick & _SAMPLE:  # Reuse hears of one random look-up in four
                with self._lock:
                    self._reuse.note(key, cached is not None)
            if type(cached) is bytes:  # a block's pickled bytes: see _alone
                item = self._item(s, b, cached, j)
                if item is not NOT_ALONE:
                    loc.nexts[s] = i + 1
                    return item
            elif cached is not None and cached[j] is not None:
                return unpickle(cached[j])
            nexts = loc.nexts
            if nexts.get(s, i) != i and s not in self._whole:
                nexts[s] = i + 1
                return self._alone(s, b, j)
        loc.nexts[s] = i + 1
        items, nbytes = self._decode_raw(s, b, *self._raw(s, b, in_order))
        if not in_order:
            self._reuse.decoded(nbytes)
        new = Hot(b, i - j, items)
        if self._keeping():  # its pickle, made before the caller can change it
            kept = pickle_one(items[j])
            if kept is not None:
                new.kept[j] = kept
        item = items[j]
        items[j] = TAKEN
        self._make_hot(s, new)
        loc.last = (new.lo, len(items), items)
        return item

    def _alone(self, s: int, b: int, j: int) -> Any:
        """Example ``j`` of block ``b`` of shard ``s``, for a read at random: the block
        decompressed and, while reads come back to blocks, kept in the cache as it is (a pickle
        of plain data is its own compact form); the example alone unpickled from it (see
        ``load_item``), or the whole block where the walk cannot vouch for the example (then
        the shard's later reads unpickle whole blocks: its examples hold more than plain
        data)."""
        stored = self._read_raw(s, b)
        plain = self._pickled(s, b, stored)
        reuse = self._reuse
        if not self._tick & _SAMPLE:
            reuse.decoded(len(plain))
        if reuse.rate >= KEEP_RATE and self._slot.cap != 0:  # self._keeping(), spelled out
            self._slot.put((s, b), plain, len(plain))  # reads come back within its reach
            self._slot.get(INDEXES)  # blocks come and go; the indexes, a twentieth, stay
        item = self._item(s, b, plain, j)
        if item is not NOT_ALONE:
            return item
        self._whole.add(s)
        seen = self._checked.digest(s, stored)
        items = self._unpickle(s, b, plain, seen in self._checked)
        self._checked.add(seen)
        return items[j]

    def _item(self, s: int, b: int, plain: bytes, j: int) -> Any:
        """Example ``j`` of block ``b`` of shard ``s`` unpickled alone from the block's pickled
        bytes, through the block's index (see ``block_index``), made on the block's first read
        and kept in the cache, where it costs a few hundred bytes: a random read of a block
        seen before walks the example's bytes only, not the whole block. NOT_ALONE where the
        walk cannot vouch for the example."""
        indexes = self._slot.peek(INDEXES)
        if indexes is not None:
            index = indexes.map.get((s, b))
            if index is not None:
                item = load_indexed(plain, index, j)
                if item is not NOT_ALONE:
                    return item
        got = block_index(plain, self.shards[s].meta.block_len(b), j)
        if got is None:
            return NOT_ALONE
        if self._slot.cap:
            with self._lock:
                keep_index(self._slot, indexes, (s, b), got[0])
        return got[1]

    def take(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The examples at ``indices`` in that order, decoding each needed block once."""
        self._check_pid()
        idx = normalize_indices(indices, self._len)
        out: list[Any] = [None] * len(idx)
        if not len(idx):
            return out
        shard = np.searchsorted(self._ends, idx, side="right")
        local = idx - self._starts[shard]
        bsz = self._block_sizes_arr[shard]
        block, pos = np.divmod(local, bsz)
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for k, (s, b, j) in enumerate(
            zip(shard.tolist(), block.tolist(), pos.tolist(), strict=True)
        ):
            groups.setdefault((s, b), []).append((k, j))
        hot = self._local.hot
        for key, members in sorted(groups.items()):
            h = hot.get(key[0])
            if h is not None and h.block == key[1]:
                if all(h.items[j] is not TAKEN for _, j in members):
                    self._hand_out(h.items, members, out)
                    continue
            pickled = self._cached(key)
            if type(pickled) is bytes:  # the block's pickled bytes (see _alone)
                self._hand_out(self._unpickle(*key, pickled), members, out)
                continue
            if pickled is not None and all(pickled[j] is not None for _, j in members):
                for k, j in members:
                    out[k] = unpickle(pickled[j])  # type: ignore[arg-type]
                continue
            items, nbytes = self._decode_raw(*key, self._read_raw(*key))
            self._reuse.decoded(nbytes)
            if self._keeping():
                pickled, total = pickle_block(items, {})
                if total:
                    self._slot.put(key, pickled, total)
            self._hand_out(items, members, out)
        return out

    @staticmethod
    def _hand_out(items: list[Any], members: list[tuple[int, int]], out: list[Any]) -> None:
        """Examples ``j`` of a decoded block into ``out[k]``; the same one twice is copied."""
        first: dict[int, int] = {}
        for k, j in members:
            if j in first:
                out[k] = copy.deepcopy(out[first[j]])
            else:
                first[j] = k
                out[k] = items[j]
                items[j] = TAKEN

    def __iter__(self) -> Iterator[Any]:
        """Every example in order: blocks read in large ranged reads and decompressed ahead
        on the decoder thread (see :mod:`.ahead`)."""
        self._check_pid()
        for s, sh in enumerate(self.shards):
            st = self._stream(s, 0, self._ahead_bytes)
            for b in range(sh.meta.num_blocks):
                got = st.get(b)
                if got is None:  # the one-block read says precisely what is wrong
                    yield from self._read_block(s, b)[0]
                else:
                    yield from self._decode_raw(s, b, *got)[0]

    # ---- extras ----------------------------------------------------------------------------

    def shard_of(self, index: int) -> tuple[str, int]:
        """(shard folder name, index within that shard) of example ``index``."""
        i = normalize_index(index, self._len)
        s = bisect_right(self._ends_list, i)
        return self._names[s], i - self._starts_list[s]

    def block_bytes(self, s: int, b: int) -> bytes:
        """The stored bytes of block ``b`` of the ``s``-th shard (for tools and validation)."""
        return self._read_raw(s, b)
