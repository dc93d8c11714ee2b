"""Drop-in for seqax's ``tools/flat_tokens.py``: ``Split``, ``Config``, ``Chunk``, ``Writer``.

Change ``from tools.flat_tokens import Writer, Config, Chunk, Split`` to
``from lmdata.compat.seqax import ...``. The dataset has seqax's layout (zarr v2, Blosc lz4
bit-shuffle, a Delta filter on ``seq_starts``, ``max_token_id`` on each split) and works with
zarr-python 3, which seqax's own writer does not.

Mode ``a`` or ``r+`` on an existing dataset appends to it as seqax does (each split's arrays
grow as zarr-python 2 grows them, byte for byte; a missing split is created with the
``Config``'s chunks; see :mod:`lmdata.compat._seqax_append`); ``r+`` on a missing path is an
error, as in seqax.

Differs from seqax, on purpose: the data appears when every ``Writer`` on the path is closed
(``close()``, a ``with`` block, garbage collection or the end of the program), instead of after
each ``write``: a new dataset atomically, an append with its metadata replaced last; an
exception inside ``with`` leaves nothing (a new dataset) or the old content (an append). Writers
of the two splits of one path share that output, and a new dataset always has both splits.
Write errors are raised, never lost in a thread; ids above 2**31-1 are refused (seqax silently
corrupts them); an empty chunk is fine.
"""

from __future__ import annotations

import enum
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmdata.compat._seqax_append import SplitAppend
from lmdata.errors import DatasetNotFoundError, InvalidInputError, OutputExistsError
from lmdata.formats.flat_tokens import Writer as _FlatWriter
from lmdata.storage.manifest_output import InPlace

__all__ = ["Chunk", "Config", "Split", "Writer"]


class Split(enum.Enum):
    TRAIN = "train"
    VALIDATION = "validation"


@dataclass
class Config:
    """Chunk sizes of the two arrays, in elements."""

    tokens_chunk_size: int
    seq_starts_chunk_size: int
    _target_: str = __name__ + ".Config"


@dataclass
class Chunk:
    """Sequences in flat-tokens encoding: ids shifted left by one with the start bit set at
    each sequence start, ``seq_starts`` with a leading 0 and the total at the end."""

    encoded_tokens: np.ndarray  # uint32[num_tokens]
    seq_starts: np.ndarray  # uint64[num_seqs + 1]
    max_token_id: int

    @staticmethod
    def from_ragged(sequences: list[np.ndarray]) -> Chunk:
        lengths = np.array([len(s) for s in sequences], dtype=np.uint64)
        seq_starts = np.zeros(len(sequences) + 1, np.uint64)
        np.cumsum(lengths, out=seq_starts[1:])
        tokens = np.concatenate([np.asarray(s) for s in sequences]) if sequences else None
        if tokens is None or not len(tokens):
            return Chunk(np.zeros(0, np.uint32), seq_starts, 0)
        max_token_id = tokens.max()
        tokens = tokens.astype(np.uint32) << np.uint32(1)
        starts = seq_starts[:-1][lengths > 0].astype(np.int64)
        tokens[starts] |= np.uint32(1)
        return Chunk(tokens, seq_starts, max_token_id)


class _Output:
    """One dataset being written, shared by the Writers of its splits: a new one (written
    atomically by lmdata's flat-tokens writer) or an existing one appended to in place."""

    def __init__(self, path: Path, mode: str, config: Config) -> None:
        if mode not in ("w", "w-", "x", "a", "r+"):
            raise InvalidInputError(f"mode must be 'w', 'w-', 'a' or 'r+', got {mode!r}")
        self.config = config
        self.users = 0
        self.appends: dict[str, SplitAppend] = {}
        self.writer: _FlatWriter | None = None
        exists = path.exists() or path.is_symlink()
        if exists and mode in ("w-", "x"):
            raise OutputExistsError(f"Output {path} already exists.", path=path)
        empty_dir = exists and path.is_dir() and not any(path.iterdir())
        if exists and mode in ("a", "r+") and not empty_dir:
            if not (path / ".zgroup").is_file():
                raise InvalidInputError(
                    "seqax's Writer appends to a flat-tokens dataset (a zarr v2 group with a "
                    ".zgroup file) and this is none; pick another path or mode 'w' to "
                    "replace it",
                    path=path,
                )
            self.root: Path | None = path
            self._manifest = InPlace(path).begin()  # an lmdata manifest is kept right
            return
        if not exists and mode == "r+":
            raise DatasetNotFoundError(
                f"{path} does not exist: mode 'r+' appends to an existing dataset ('a' or 'w' "
                "creates one)",
                path=path,
            )
        self.root = None
        self.writer = _FlatWriter(
            path,
            chunk_tokens=config.tokens_chunk_size,
            seq_starts_chunk=config.seq_starts_chunk_size,
            compression="blosc",
            overwrite=mode == "w" or empty_dir,
            manifest=False,  # seqax's file set
        )

    def open_split(self, split: str) -> None:
        if self.root is not None and split not in self.appends:
            self.appends[split] = SplitAppend(
                self.root, split, self.config.tokens_chunk_size, self.config.seq_starts_chunk_size
            )

    def write(self, split: str, encoded: np.ndarray, starts: np.ndarray, max_id: int) -> None:
        if self.writer is not None:
            self.writer.write_many(encoded >> np.uint32(1), np.diff(starts), split)
        else:
            self.appends[split].write(encoded, starts.astype(np.uint64), max_id)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            return
        try:
            for s in self.appends.values():
                s.finish()
            self._manifest.finish()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
        for s in self.appends.values():
            s.abort()
        if self.root is not None:
            self._manifest.abort()


_OPEN: dict[Path, _Output] = {}
_LOCK = threading.Lock()


def _release(path: Path, failed: bool) -> None:
    with _LOCK:
        out = _OPEN.get(path)
        if out is None:
            return
        out.users -= 1
        if failed:
            del _OPEN[path]
            out.abort()
        elif out.users == 0:
            del _OPEN[path]
            out.close()


class Writer:
    """seqax's ``Writer(filespec, split, mode, config)``: ``write(chunk)`` appends the chunk's
    sequences to ``split``. See the module docstring for when the dataset appears."""

    def __init__(self, filespec: str, split: Split, mode: str, config: Config) -> None:
        if "://" in str(filespec):
            raise InvalidInputError(f"{filespec!r}: lmdata.compat.seqax writes local paths only")
        self.path = Path(os.path.abspath(filespec))
        self.split = Split(split)
        with _LOCK:
            out = _OPEN.get(self.path)
            if out is None:
                out = _OPEN[self.path] = _Output(self.path, mode, config)
            elif (out.config.tokens_chunk_size, out.config.seq_starts_chunk_size) != (
                config.tokens_chunk_size,
                config.seq_starts_chunk_size,
            ):
                raise InvalidInputError(
                    "the writers of one dataset must share its Config", path=self.path
                )
            try:
                out.open_split(self.split.value)
            except BaseException:
                if not out.users:
                    del _OPEN[self.path]
                raise
            out.users += 1
        self._out = out
        self._finalizer = weakref.finalize(self, _release, self.path, False)

    def write(self, chunk: Chunk) -> None:
        """Append the chunk's sequences (committed when the writers close)."""
        starts = np.asarray(chunk.seq_starts, dtype=np.int64)
        encoded = np.asarray(chunk.encoded_tokens, dtype=np.uint32)
        if len(starts) < 1 or starts[0] != 0 or starts[-1] != len(encoded):
            raise InvalidInputError(
                "chunk.seq_starts must start at 0 and end at len(encoded_tokens) "
                "(build chunks with Chunk.from_ragged)"
            )
        if int(chunk.max_token_id) > 2**31 - 1:
            raise InvalidInputError(
                f"token id {int(chunk.max_token_id)} does not fit flat-tokens (at most 2**31-1)"
            )
        self._out.write(self.split.value, encoded, starts, int(chunk.max_token_id))

    def close(self) -> None:
        """Done with this split; the dataset appears once every writer on it is closed."""
        self._finalizer()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._finalizer.detach()
            _release(self.path, True)
