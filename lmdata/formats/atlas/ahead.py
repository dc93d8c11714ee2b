"""Reading a shard's blocks in order: stored bytes read ahead in large ranged reads, and the
next blocks decompressed on a background thread while the reader unpickles the current ones.

python-zstandard releases the GIL while it decompresses, so the reading thread is left with
the unpickling (about two thirds of a block's decode). The thread takes each run of blocks in
two calls that release the GIL, ``multi_decompress_to_buffer`` and the safe unpickler's memo
walk of every block (``_pickle.walk_all``, in C), and does nothing else: a thread that wants
the GIL back waits up to the switch interval (5 ms) while the reader runs Python, so it must
come back once per run, not once per block (nor for numpy calls, which release the GIL too:
the reader's side uses plain lists). Nothing raises on the thread: a run it could not
decompress is decoded again block by block when read, which raises the precise error naming
the file and block. Runs are checked before they are handed over (zstd magic, a declared
content size within the bound, the shard's dictionary id), so the thread allocates only what
the headers justify, and the decoded bytes ahead of the reader stay within the budget the
reader gives (its ``ahead_bytes``).
"""

from __future__ import annotations

import os
import queue
import threading
from array import array
from collections import deque
from collections.abc import Callable

import zstandard

from lmdata._pickle import walk_all
from lmdata._units import byte_count
from lmdata.formats.atlas.codec import ZSTD_MAGIC

RAW_AHEAD = 1 << 20  # stored bytes per ranged read when nothing is decompressed ahead
_MAX_RUN_BLOCKS = 1024
DEFAULT_AHEAD_BYTES = 4 << 20  # decoded bytes ahead of each thread reading in order


def ahead_budget(ahead_bytes: int | None) -> int:
    """Decoded bytes a reader may hold ahead of each thread reading in order: ``ahead_bytes``
    as given, or by default 4 MiB, and 0 with one CPU, where the thread would only take turns
    with the reader. This allowance is apart from the reader's ``cache_bytes`` (as the origin
    keeps each shard's current block decoded whatever its cache): a small cache still reads
    in order at full speed.

    Less ahead and the reader waits for the thread more often (runs are half the allowance,
    and each run costs the reader about 0.35 ms in hand-offs): over 200k examples, 0.5 MiB
    ahead took 0.61 s, 1 MiB 0.51 s, 4 MiB 0.44-0.50 s.
    """
    if ahead_bytes is None:
        return DEFAULT_AHEAD_BYTES if _cpus() >= 2 else 0
    return byte_count(
        ahead_bytes, "ahead_bytes", "decompresses nothing ahead; None (the default) takes 4 MiB"
    )


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Run:
    """Blocks ``first .. first + len(offs) - 2`` of a shard: their stored bytes ``buf`` (block
    ``k`` at ``offs[k] - offs[0]``), and once the decoder has run, their pickled bytes."""

    __slots__ = ("_done", "_out", "_walked", "buf", "decoded", "dropped", "first", "offs", "pid")

    def __init__(self, first: int, offs: list[int], buf: bytes, decoded: int = 0) -> None:
        self.first = first
        self.offs = offs
        self.buf = buf
        self.decoded = decoded  # bytes the decoder produces for this run (0: none)
        self.dropped = False  # its stream let go of it: the decoder skips it if not begun
        self.pid = os.getpid()
        self._out: zstandard.BufferWithSegmentsCollection | None = None
        self._walked: memoryview | None = None
        self._done: threading.Lock | None = None

    @property
    def stop(self) -> int:
        return self.first + len(self.offs) - 1

    def stored(self, b: int) -> bytes:
        k = b - self.first
        base = self.offs[0]
        return self.buf[self.offs[k] - base : self.offs[k + 1] - base]

    def plain(self, b: int) -> tuple[memoryview | None, tuple[int, int, int] | None]:
        """(block ``b``'s pickled bytes from the decoder (waiting for it), the memo walk's
        answer for them); None for the bytes where nothing was decompressed ahead, the
        decoder failed, or this process is a fork of the one that asked (whose thread it does
        not have)."""
        done = self._done
        if done is not None:
            if self.pid != os.getpid():
                return None, None
            done.acquire()  # released once by the decoder; this run has one reader
            self._done = None
        out = self._out
        if out is None:
            return None, None
        k = b - self.first
        w = self._walked
        return memoryview(out[k]), (None if w is None else (w[3 * k], w[3 * k + 1], w[3 * k + 2]))

    def frames(self) -> zstandard.BufferWithSegments:
        """The run's stored blocks as python-zstandard's segmented buffer."""
        offs = self.offs
        base = offs[0]
        pairs = array("Q")
        for k in range(len(offs) - 1):
            pairs.append(offs[k] - base)
            pairs.append(offs[k + 1] - offs[k])
        return zstandard.BufferWithSegments(self.buf, pairs.tobytes())

    def decode(
        self,
        dctx: zstandard.ZstdDecompressor,
        frames: zstandard.BufferWithSegments,
        sizes: bytes,
    ) -> None:
        """On the decoder thread: every block of the run in one call, then the memo walk of
        each; never raises."""
        try:
            if not self.dropped:
                self._out = dctx.multi_decompress_to_buffer(frames, decompressed_sizes=sizes)
                self._walked = walk_all(self._out)
        except BaseException:  # the read decodes the block again and reports it
            self._out = self._walked = None
        finally:
            assert self._done is not None
            self._done.release()


class Decoder:
    """One daemon thread decompressing runs for one reader in one process, in order."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(
            target=_serve, args=(self._jobs,), name="lmdata-atlas-decoder", daemon=True
        ).start()

    def submit(self, run: Run, dctx: zstandard.ZstdDecompressor, sizes: bytes) -> bool:
        """Queue ``run`` for decompression; False once stopped (then the reader decodes it)."""
        done = threading.Lock()
        done.acquire()
        frames = run.frames()
        with self._lock:
            if self._stopped or self.pid != os.getpid():
                return False
            run._done = done
            self._jobs.put((run, dctx, frames, sizes))
        return True

    def stop(self) -> None:
        """End the thread after the runs already queued (a no-op in a forked child)."""
        with self._lock:
            if not self._stopped and self.pid == os.getpid():
                self._stopped = True
                self._jobs.put(None)


_Job = tuple[Run, zstandard.ZstdDecompressor, zstandard.BufferWithSegments, bytes]


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        run, dctx, frames, sizes = job
        run.decode(dctx, frames, sizes)
        del job, run, frames


# post(first block, decoded bytes wanted) -> the next run of a shard, or None past its end (or
# where the index looks damaged: the reader's one-block path then says precisely how)
Post = Callable[[int, int], "Run | None"]


class Stream:
    """One thread's in-order reading of one shard: runs read (and decompressed) ahead, at most
    ``budget`` decoded bytes ahead of the block being read."""

    __slots__ = ("_next", "_post", "_runs", "budget", "decoding", "ended")

    def __init__(self, post: Post, first: int, budget: int, decoding: bool = True) -> None:
        self._post = post
        self._runs: deque[Run] = deque()
        self._next = first  # the first block no run covers yet
        self.decoding = decoding  # whether its blocks are compressed (else: read ahead only)
        self.budget = budget if decoding else 0
        self.ended = False  # no run comes after those it holds (its shard's end, or damage)

    @property
    def holding(self) -> bool:
        """Whether it holds runs ahead (read or decoded, not yet read by the reader)."""
        return bool(self._runs)

    def get(self, b: int) -> tuple[bytes, memoryview | None, tuple[int, int, int] | None] | None:
        """(stored bytes, pickled bytes or None, their memo walk or None) of block ``b``, or
        None if ``b`` is not the block this stream reads next (the caller then reads it on its
        own)."""
        runs = self._runs
        while runs and runs[0].stop <= b:
            runs.popleft().dropped = True
        if not runs or runs[0].first > b:
            if runs or b != self._next:
                return None
            self.fill()
            if not runs or runs[0].first > b:
                return None
        run = runs[0]
        got = (run.stored(b), *run.plain(b))
        if b + 1 >= run.stop:  # read the next runs before the reader needs them
            runs.popleft()
            self.fill()
        return got

    def drop(self) -> None:
        """Let go of the runs ahead (the reads went elsewhere): the decoder skips those it has
        not begun, so that jumps between short reads in order do not queue work without end."""
        for run in self._runs:
            run.dropped = True
        self._runs.clear()

    def trim(self) -> None:
        """Let go of the runs past the budget, last first, but the one being read: runs made
        before the budget shrank (another shard's stream came to share it) would otherwise
        stay until read, holding up to the old budget on top of the new streams' shares."""
        runs = self._runs
        ahead = sum(max(r.decoded, len(r.buf)) for r in runs)
        while len(runs) > 1 and ahead > self.budget:
            run = runs.pop()
            run.dropped = True
            ahead -= max(run.decoded, len(run.buf))
            self._next = run.first  # read again when the reader comes to it
            self.ended = False

    def fill(self) -> None:
        """Read (and hand to the decoder) runs of up to half the budget each, while the
        bytes ahead leave room for one (decoded, or stored where more: frames that declare
        little content can take much room)."""
        runs = self._runs
        per_run = self.budget // 2
        ahead = sum(max(r.decoded, len(r.buf)) for r in runs)
        while True:
            if runs and (ahead > self.budget - per_run or not runs[-1].decoded):
                return  # a raw run (nothing decoded ahead) is read one at a time
            run = self._post(self._next, per_run)
            if run is None:
                self.ended = True
                return
            runs.append(run)
            ahead += max(run.decoded, len(run.buf))
            self._next = run.stop


def frame_sizes(
    buf: bytes, offs: list[int], max_block: int, dict_id: int, budget: int
) -> tuple[int, int, bytes]:
    """(blocks, their total declared size, their sizes as uint64s) of the longest prefix of
    the zstd frames in ``buf`` (block ``k`` at ``offs[k] - offs[0]``) whose headers are the
    usual ones (magic, a content size within ``max_block``, no dictionary or ``dict_id``) and
    whose sizes sum to at most ``budget`` (at least one block, if its header is usual)."""
    base = offs[0]
    sizes: list[int] = []
    total = 0
    mv = memoryview(buf)
    get_params = zstandard.get_frame_parameters
    unknown = zstandard.CONTENTSIZE_UNKNOWN
    for k in range(min(len(offs) - 1, _MAX_RUN_BLOCKS)):
        a = offs[k] - base
        if buf[a : a + 4] != ZSTD_MAGIC:
            break
        try:
            p = get_params(mv[a : offs[k + 1] - base])
        except zstandard.ZstdError:
            break
        size = p.content_size
        if size == unknown or not 0 <= size <= max_block or p.dict_id not in (0, dict_id):
            break
        if sizes and total + size > budget:
            break
        sizes.append(size)
        total += size
    return len(sizes), total, array("Q", sizes).tobytes()
