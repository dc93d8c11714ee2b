"""Writing Atlas datasets that torch-atlas-ds reads, byte for byte where the origin is
deterministic (metas, index.npy, pickled blocks, frames given the same dictionary).

Beyond the origin: the dataset appears at its path only when the writer closes without an
exception; blocks are compressed on several threads; strategy-3 shards spill their pickled
blocks to disk instead of RAM; dictionaries train on an evenly spread sample of at most
``dict_sample_bytes`` (8 MiB by default; the origin trains on the whole shard, which costs about
2.5x the time on a 25 MB shard for a 0.1% smaller data.bin, and fails over 4 GiB), so a
dictionary equals the origin's only for shards within that; and ``append=True`` adds shards
to an existing dataset.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from lmdata import _provenance
from lmdata._options import checked
from lmdata.errors import (
    DatasetNotFoundError,
    InvalidInputError,
    LmdataError,
)
from lmdata.formats.atlas import codec
from lmdata.formats.atlas.meta import (
    DATA,
    DICT,
    META,
    DatasetMeta,
    ShardMeta,
    Strategy,
    padded_name,
    parse_strategy,
    replace_bytes,
    shard_dirs,
)
from lmdata.formats.atlas.shard import ShardWriter
from lmdata.storage import (
    AtomicWriter,
    LocalStore,
    LocalTree,
    Output,
    Store,
    join,
    resolve,
    shown,
)
from lmdata.storage import manifest as _manifest

DEFAULT_SHARD_SIZE = 100_000
DEFAULT_BLOCK_SIZE = 32


class Writer(AtomicWriter):
    """Writes examples (any picklable objects; dicts for JSON-like data) into an Atlas dataset.

    ``shard_size`` examples per shard, ``block_size`` per block; ``compression_strategy`` is
    0/"none", 1/"standard", 2/"shared" (the origin's default: a dictionary trained on shard 0,
    used by all) or 3/"dictionary" (one per shard); ``compression_level`` (zstd, up to 22) and
    ``compression_dict_size`` (dictionary bytes as a fraction of a shard's pickled bytes) have
    the origin's meaning. ``compression_dict`` supplies the shared dictionary instead of training
    one; a trained one learns from at most ``dict_sample_bytes`` of the shard's blocks.
    ``workers`` threads compress blocks. ``append=True`` adds shards to the dataset at
    ``path``, keeping its strategy, shared dictionary, level and block size unless given.
    ``storage_options`` are fsspec's options for a URL ``path`` (``s3://...``), as for every
    writer.

    Examples must be plain data (dicts, lists, tuples, sets, str, bytes, numbers, None, numpy
    arrays and scalars), which readers load safely; anything else (a ``datetime``, an instance
    of your class) raises InvalidInputError, unless ``allow_unsafe_pickle=True``, which stores
    any picklable object and leaves readers to need ``allow_unsafe_pickle=True`` as well.
    ``provenance`` (what made the tokens, see :mod:`lmdata._provenance`) goes into a file
    ``lmdata.json`` beside the root ``meta.json``. ``manifest`` (default True) writes the
    dataset's manifest (``lmdata-manifest``, every file's size and hashes; the origin opens
    only folders) last; shards taken from a dataset with one (append, ``add_dataset``, merge)
    keep the hashes it lists.
    """

    @checked("lmdata.formats.atlas.writer.Writer")
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shard_size: int | None = None,
        block_size: int | None = None,
        compression_strategy: int | str | None = None,
        compression_level: int | None = None,
        compression_dict_size: float | None = None,
        compression_dict: bytes | None = None,
        workers: int | None = None,
        dict_sample_bytes: int = codec.DICT_SAMPLE_BYTES,
        pickle_protocol: int = codec.PICKLE_PROTOCOL,
        append: bool = False,
        overwrite: bool = False,
        allow_unsafe_pickle: bool = False,
        provenance: dict[str, Any] | None = None,
        storage_options: dict[str, Any] | None = None,
        manifest: bool = True,
    ) -> None:
        self._tree = LocalTree(manifest, format="atlas")
        if shard_size is not None and (
            isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1
        ):
            raise InvalidInputError(f"shard_size must be a positive integer, got {shard_size!r}")
        if block_size is not None and (
            isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1
        ):
            raise InvalidInputError(f"block_size must be a positive integer, got {block_size!r}")
        if compression_dict_size is not None and not 0.0 <= compression_dict_size <= 1.0:
            raise InvalidInputError(
                f"compression_dict_size is a fraction in [0, 1], got {compression_dict_size!r}"
            )
        if dict_sample_bytes < 1024:
            raise InvalidInputError("dict_sample_bytes must be at least 1024")
        self.shard_size = shard_size or DEFAULT_SHARD_SIZE
        self.workers = workers if workers is not None else codec.default_workers()
        self.dict_sample_bytes = dict_sample_bytes
        self.protocol = pickle_protocol
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self._provenance = provenance
        self.shard_sizes: list[int] = []
        self._numbers: list[int] = []
        self._shared: bytes | None = None
        self._train_shard0 = False
        self._shard: ShardWriter | None = None
        self._written = 0
        if append:
            self._init_append(
                self._append_root(path, storage_options),
                shard_size,
                block_size,
                compression_strategy,
                compression_level,
                compression_dict_size,
                compression_dict,
            )
        else:
            self._init_new(
                path,
                block_size,
                compression_strategy,
                compression_level,
                compression_dict_size,
                compression_dict,
                overwrite,
                storage_options,
            )
        self._open_shard()

    # ---- setup ------------------------------------------------------------------------------

    def _init_new(
        self,
        path: Any,
        block_size: int | None,
        strategy: Any,
        level: int | None,
        fraction: float | None,
        shared: bytes | None,
        overwrite: bool,
        storage_options: dict[str, Any] | None,
    ) -> None:
        self.strategy = parse_strategy(
            Strategy.SHARED_DICTIONARY_COMPRESSION if strategy is None else strategy
        )
        self.block_size = block_size or DEFAULT_BLOCK_SIZE
        self.level = 3 if level is None else level
        self.dict_fraction = 0.01 if fraction is None else fraction
        if shared is not None:
            if self.strategy != Strategy.SHARED_DICTIONARY_COMPRESSION:
                raise InvalidInputError("compression_dict is only used with strategy 2 (shared)")
            self._shared = bytes(shared)
        else:
            # The origin writes shard 0 of a strategy-2 dataset as strategy 3 and moves its
            # dictionary to the root afterwards.
            self._train_shard0 = self.strategy == Strategy.SHARED_DICTIONARY_COMPRESSION
        self._check_level()
        store, key = resolve(path, storage_options)
        # built in a local folder (shards are rewritten and renamed as they finish), renamed
        # into place at close or uploaded, meta.json last
        self._out: Output = store.output(key, directory=True, overwrite=overwrite, local=True)
        self.path = shown(store, self._out.dest)
        self._root = self._local_root()
        self._next_number = 0
        if self._shared is not None:
            codec.load_dict(self._shared, "compression_dict")
            (self._root / DICT).write_bytes(self._shared)

    def _local_root(self) -> Path:
        assert self._out.tmp is not None  # a local=True output is built in a local folder
        return Path(self._out.tmp)

    def _append_root(self, path: Any, storage_options: dict[str, Any] | None) -> Path:
        """The dataset to extend, copied into the local folder of an output that replaces it
        at close (hard links from local disk, ranged reads from an object store): readers see
        the old dataset until the commit (on a store, its claim keeps other writers out)."""
        store, key = resolve(path, storage_options)
        if not store.exists(key):
            raise DatasetNotFoundError("no such file or directory", path=shown(store, key))
        DatasetMeta.read(PurePosixPath(key), store)  # an Atlas dataset root, before any copy
        self._out = store.output(key, directory=True, overwrite=True, local=True)
        self.path = shown(store, self._out.dest)
        try:
            store.get_tree(key, str(self._local_root()))
        except BaseException:
            self._out.abort()
            raise
        return self._local_root()

    def _init_append(
        self,
        root: Path,
        shard_size: int | None,
        block_size: int | None,
        strategy: Any,
        level: int | None,
        fraction: float | None,
        shared: bytes | None,
    ) -> None:
        meta = DatasetMeta.read(root)
        shards = shard_dirs(root)
        last = ShardMeta.read(shards[-1][1]) if shards else None
        self.strategy = meta.compression_strategy
        if strategy is not None and parse_strategy(strategy) != self.strategy:
            raise InvalidInputError(
                f"the dataset uses compression strategy {int(self.strategy)}; appended shards "
                "must use the same (leave compression_strategy unset)",
                path=root,
            )
        if shared is not None:
            raise InvalidInputError("compression_dict cannot change when appending", path=root)
        self.block_size = block_size or (last.block_size if last else DEFAULT_BLOCK_SIZE)
        last_level = last.compression_level if last else None
        last_fraction = last.compression_dict_size if last else None
        self.level = (
            level
            if level is not None
            else (
                last_level
                if isinstance(last_level, int) and not isinstance(last_level, bool)
                else 3
            )
        )
        self.dict_fraction = (
            fraction
            if fraction is not None
            else (last_fraction if isinstance(last_fraction, (int, float)) else 0.01)
        )
        self._check_level()
        if self.strategy == Strategy.SHARED_DICTIONARY_COMPRESSION:
            try:
                self._shared = (root / DICT).read_bytes()
            except FileNotFoundError:
                raise InvalidInputError(
                    "the dataset says strategy 2 but has no zstd_dict.bin; run `lmdata validate`",
                    path=root,
                ) from None
            codec.load_dict(self._shared, "zstd_dict.bin")
        # The extended dataset is built in the output's folder, which holds hard links to the
        # existing files (or copies), then swapped in: readers see the old dataset or the new
        # one, never a mix.
        self._root = root
        self._tree.adopt(_manifest_entries(LocalStore(), str(root)), self._root)
        sizes = {n: ShardMeta.read(d).stored_examples for n, d in shards}
        self._numbers = [n for n, _ in shards]
        self.shard_sizes = [sizes[n] for n in self._numbers]
        self._next_number = self._numbers[-1] + 1 if shards else 0
        if shard_size is None and max(self.shard_sizes, default=0) > 0:
            self.shard_size = max(self.shard_sizes)  # continue with the dataset's shard size

    def _check_level(self) -> None:
        if isinstance(self.level, bool) or not isinstance(self.level, int):
            raise InvalidInputError(f"compression_level must be an integer, got {self.level!r}")
        codec.BlockCompressor(self.level).close()  # validates the range

    def _open_shard(self) -> None:
        number = self._next_number
        self._next_number += 1
        train = self.strategy == Strategy.DICTIONARY_COMPRESSION or (
            self._train_shard0 and number == 0
        )
        compressor = None
        if self.strategy != Strategy.NO_COMPRESSION and not train:
            compressor = codec.BlockCompressor(self.level, self._shared, self.workers)
        self._shard = ShardWriter(
            self._root / str(number),
            block_size=self.block_size,
            strategy=self.strategy,
            level=self.level,
            dict_fraction=self.dict_fraction,
            compressor=compressor,
            train=train,
            workers=self.workers,
            dict_sample_bytes=self.dict_sample_bytes,
            protocol=self.protocol,
            allow_unsafe_pickle=self.allow_unsafe_pickle,
            open_data=self._tree.open,
        )
        self._numbers.append(number)

    def _close_shard(self) -> None:
        assert self._shard is not None
        shard, self._shard = self._shard, None
        meta = shard.close()
        if shard.compressor is not None:
            shard.compressor.close()
        if (shard.folder / DATA).exists():
            self._tree.count(shard.folder / DATA, meta.stored_examples)
        self.shard_sizes.append(meta.stored_examples)
        self._written += meta.stored_examples
        if self._train_shard0 and self._numbers[-1] == 0:
            self._train_shard0 = False
            self._handle_shared_dict(shard.folder, meta)

    def _handle_shared_dict(self, folder: Path, meta: ShardMeta) -> None:
        """After shard 0 of a strategy-2 dataset: move its dictionary to the root, or make the
        whole dataset strategy 1 when shard 0 could not train one (the origin's rules)."""
        if meta.compression_strategy == Strategy.STANDARD_COMPRESSION:
            self.strategy = Strategy.STANDARD_COMPRESSION
            return
        os.replace(folder / DICT, self._root / DICT)
        self._shared = (self._root / DICT).read_bytes()
        shared_meta = ShardMeta(
            block_size=meta.block_size,
            stored_examples=meta.stored_examples,
            compression_strategy=Strategy.SHARED_DICTIONARY_COMPRESSION,
            compression_level=meta.compression_level,
            compression_dict_size=meta.compression_dict_size,
        )
        replace_bytes(folder / META, shared_meta.to_json())

    # ---- the writer protocol ----------------------------------------------------------------

    def write(self, example: Any) -> None:
        """Append one example. A new shard starts when one arrives and the current is full."""
        if self._shard is None:
            raise InvalidInputError("the writer is closed", path=self.path)
        if self._shard.count >= self.shard_size:
            self._close_shard()
            self._open_shard()
        self._shard.add(example)

    def write_many(self, examples: Any) -> None:
        for ex in examples:
            self.write(ex)

    def add_dataset(self, path: str | os.PathLike[str], **read_options: Any) -> None:
        """Append every example of the Atlas dataset at ``path``, in order.

        Its shard folders are hard-linked (or copied) as they are when they decode on their
        own (strategies 0, 1, 3) or share this dataset's dictionary; otherwise its examples are
        decoded (safely, unless ``allow_unsafe_pickle=True``) and written anew.
        """
        from lmdata.formats.atlas.reader import Atlas

        if self._shard is None:
            raise InvalidInputError("the writer is closed", path=self.path)
        src = Atlas(path, **read_options)
        src_dict = str(src._dict_dir / DICT) if src._dict_dir else None
        carried = _manifest_entries(src.store, str(src.root))
        for sh in src.shards:
            if sh.meta.stored_examples == 0:
                continue
            strategy = sh.meta.compression_strategy
            if strategy == Strategy.SHARED_DICTIONARY_COMPRESSION:
                shared = None
                if src_dict and src.store.exists(src_dict) and not src.store.is_dir(src_dict):
                    shared = src.store.read(src_dict)
                if self._adopt_dictionary(shared):
                    strategy = Strategy.STANDARD_COMPRESSION  # now linkable
            if strategy != Strategy.SHARED_DICTIONARY_COMPRESSION:
                prefix = f"{sh.folder.name}/"
                entries = [
                    e.renamed(e.name[len(prefix) :]) for e in carried if e.name.startswith(prefix)
                ]
                self._link_shard(src.store, sh.folder, sh.meta.stored_examples, entries)
            else:
                s = src.shards.index(sh)
                for i in range(int(src._starts[s]), int(src._ends[s])):
                    self.write(src[i])
        src.close()

    def _adopt_dictionary(self, shared: bytes | None) -> bool:
        """Whether strategy-2 shards using ``shared`` can be linked as they are: yes when it is
        this dataset's dictionary, or when nothing is written yet and it can become it."""
        if shared is None or self.strategy != Strategy.SHARED_DICTIONARY_COMPRESSION:
            return False
        if self._shared is not None:
            return shared == self._shared
        if (
            self._train_shard0
            and self._numbers == [0]
            and self._shard is not None
            and (self._shard.count == 0)
        ):
            self._train_shard0 = False
            self._shared = shared
            (self._root / DICT).write_bytes(shared)
            self._shard.abort()
            shutil.rmtree(self._shard.folder)
            self._shard, self._numbers, self._next_number = None, [], 0
            self._open_shard()
            return True
        return False

    def _link_shard(
        self,
        store: Store,
        folder: PurePath,
        count: int,
        entries: list[_manifest.FileEntry] | None = None,
    ) -> None:
        """Take a finished shard folder of ``store`` as the next shard (after the current one):
        hard-linked from local disk, fetched in ranged reads from an object store."""
        assert self._shard is not None
        if self._shard.count:
            self._close_shard()
        else:  # reuse the empty current shard's number
            self._shard.abort()
            shutil.rmtree(self._shard.folder)
            self._numbers.pop()
            self._next_number -= 1
            self._shard = None
        number = self._next_number
        self._next_number += 1
        store.get_tree(str(folder), str(self._root / str(number)))
        self._tree.adopt(entries or [], self._root / str(number))
        self._numbers.append(number)
        self.shard_sizes.append(count)
        self._written += count
        if number == 0:
            self._train_shard0 = False  # shard 0 is taken as it is; no dictionary to train
        self._open_shard()

    @property
    def count(self) -> int:
        """Examples written by this writer so far (not counting an appended-to dataset's)."""
        return self._written + (self._shard.count if self._shard else 0)

    def close(self) -> None:
        """Finish every shard, write the root meta, zero-pad the shard folders, publish."""
        if self._out.done:
            return
        try:
            if self._shard is not None:
                if self._shard.count == 0 and len(self._numbers) > 1:
                    # Never leave an empty trailing shard (the origin never writes one).
                    self._shard.abort()
                    shutil.rmtree(self._shard.folder)
                    self._numbers.pop()
                    self._shard = None
                else:
                    self._close_shard()
            current = dict(shard_dirs(self._root))
            total = self._numbers[-1] + 1
            for number in self._numbers:
                dst = self._root / padded_name(number, total)
                if current[number] != dst:
                    os.replace(current[number], dst)
            meta = DatasetMeta(
                shard_sizes=tuple(self.shard_sizes), compression_strategy=self.strategy
            )
            if self._provenance is not None:  # a file: the origin opens only folders
                replace_bytes(self._root / _provenance.FILE, _provenance.dumps(self._provenance))
            # what makes a reader accept the dataset, then the manifest listing every file
            self._out.write_last(META, meta.to_json())
            self._tree.records = sum(self.shard_sizes)
            if self._tree.enabled:
                self._out.write_last(_manifest.NAME, self._tree.manifest(self._root).to_bytes())
            self._out.commit()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop everything written; the path is left as it was before the writer started."""
        if self._shard is not None:
            self._shard.abort()
            self._shard = None
        self._out.abort()


def _manifest_entries(store: Store, key: str) -> list[_manifest.FileEntry]:
    """The files the manifest of the dataset at ``key`` lists (none if it has no readable
    one: its files are then hashed anew)."""
    try:
        found = _manifest.read(store, join(key, _manifest.NAME))
    except LmdataError:
        return []
    return list(found.files) if found is not None else []
