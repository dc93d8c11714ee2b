"""The contract every format package fulfils: one frozen :class:`FormatSpec`, exported as ``SPEC``.

The registry (:mod:`lmdata.formats`) holds these specs and nothing else; the rest of lmdata
(``lmdata.open``, ``convert``, ``tokenize``, the CLI) asks a spec what a format can do instead of
comparing format names. A spec also says how ``tokenize`` and ``convert`` write token sequences
into the format (:class:`TokenTarget`): its end-of-document convention, its default for the
tokenizer's special tokens, and which writer options apply.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lmdata.errors import InvalidInputError

if TYPE_CHECKING:
    import numpy as np

    from lmdata._progress import OnProgress
    from lmdata.protocols import Records, TokenSequences, Writer

Kind = Literal["records", "tokens"]
PathArg = str | os.PathLike[str]


class OpenFn(Protocol):
    """``open(path, **options)``: a reader of the dataset at ``path``. A format's own options
    (``allow_unsafe_pickle``, ``cache_bytes``, ...) are keyword parameters it names, so that
    ``lmdata.open`` refuses the ones it does not take."""

    def __call__(self, path: PathArg, /) -> Records | TokenSequences: ...


class WriterFn(Protocol):
    """``writer(path, *, overwrite=False, storage_options=None, **options)``: a new
    :class:`~lmdata.protocols.Writer` at ``path`` (a writer class is one)."""

    def __call__(
        self,
        path: PathArg,
        /,
        *,
        overwrite: bool = ...,
        storage_options: dict[str, Any] | None = ...,
    ) -> Writer: ...


class ValidateFn(Protocol):
    """``validate(path, *, progress=None, **options)``: every problem found (empty: valid)."""

    def __call__(self, path: PathArg, /, *, progress: OnProgress | None = ...) -> list[str]: ...


class InfoFn(Protocol):
    """``info(path, *, scan=True, progress=None, **options)``: a summary dict
    (``scan=False``: only what needs no pass over the data)."""

    def __call__(
        self, path: PathArg, /, *, scan: bool = ..., progress: OnProgress | None = ...
    ) -> dict[str, Any]: ...


class MergeFn(Protocol):
    """``merge(inputs, output, *, overwrite=False, progress=None)``: join datasets of the
    format into one at ``output``."""

    def __call__(
        self,
        inputs: list[str],
        output: str,
        /,
        *,
        overwrite: bool = ...,
        progress: OnProgress | None = ...,
    ) -> MergeSummary: ...


@dataclass(frozen=True)
class MergeSummary:
    """What :func:`lmdata.merge` did: ``inputs`` datasets (or partitions, files) of
    ``format`` joined into ``output``, holding ``records`` (documents, samples, examples),
    with ``tokens`` where the format counts them. ``line()`` says it in one line."""

    format: str
    inputs: int
    output: str
    records: int
    tokens: int | None = None

    def line(self) -> str:
        tokens = f", {self.tokens:,} tokens" if self.tokens is not None else ""
        return (
            f"merged {self.inputs} {self.format} inputs: {self.records:,} records{tokens} "
            f"-> {self.output}"
        )


class TokenSink(Protocol):
    """What tokenize and convert write into: documents as one flat array plus their lengths."""

    def write_many(self, flat: np.ndarray, lengths: np.ndarray, split: str) -> None:
        """Append documents (``flat`` is their concatenation) to ``split``."""
        ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class SinkFn(Protocol):
    """A token target's ``open``: a :class:`TokenSink` writing a new dataset at ``path``."""

    def __call__(
        self,
        path: PathArg,
        /,
        *,
        overwrite: bool = ...,
        vocab_size: int | None = ...,
        eod_id: int | None = ...,
        options: Mapping[str, Any] | None = ...,
    ) -> TokenSink: ...


@dataclass(frozen=True)
class TokenTarget:
    """How token sequences are written into a format.

    ``open(path, *, overwrite, vocab_size, eod_id, options)`` returns a :class:`TokenSink`;
    ``vocab_size`` is the tokenizer's (or ``max_token_id + 1`` of a source being converted) so
    the format can pick its token width; ``eod_id`` is the end-of-document id the documents
    carry, if any (recorded where the format records it; documents arrive with it appended).
    """

    open: SinkFn
    append_eod: bool = False  # the format's convention: an EOD token after every document
    special_tokens: bool = False  # the tokenizer's post-processor (BOS/EOS) by default
    options: frozenset[str] = frozenset()  # writer options tokenize may pass (chunk_tokens, ...)


@dataclass(frozen=True)
class FormatSpec:
    """One format: its names, kind and verbs.

    ``detect(path)`` returns the name of the format found at ``path`` or None; specs of one
    family (the four MDS names) share one detector, which the registry asks once. ``splits`` are
    the fixed splits a dataset of this format always has (``("train", "validation")`` for
    flat-tokens); ``has_splits`` says whether its readers take ``split=`` at all (MDS: any
    sub-folder with its own index). ``open`` / ``writer`` / ``validate`` / ``info`` take the path
    first, then keyword options (``info`` also ``scan=False``: leave out what takes a pass over
    the data, for callers that need only metadata, sizes and provenance); the registry passes
    ``format=<name>`` to specs with ``pass_name`` (one implementation behind several names).
    ``validate``, ``info`` and ``merge`` take ``progress=`` (an
    :data:`lmdata._progress.OnProgress` or None) and report through it as they walk the
    data, in bytes (phases "validate", "info", "merge"). ``token_view`` is the format's
    own token-sequence view of a records reader's column (``lmdata.open(..., token_column=)``);
    without one, the generic :class:`lmdata.formats._token_view.TokenColumn` serves.
    ``companions(key)`` names the files a one-file dataset keeps beside it (a JSONL file's
    ``.idx``), which its manifest (:mod:`lmdata.storage.manifest`) lists with it.
    ``provenance(reader)`` is the record of what made the dataset a reader of this format reads
    (:mod:`lmdata._provenance`, from its metadata alone), for the Loader's start token.
    """

    name: str
    kind: Kind
    summary: str
    detect: Callable[[Path | str], str | None]
    open: OpenFn
    writer: WriterFn
    validate: ValidateFn
    info: InfoFn
    aliases: tuple[str, ...] = ()
    has_splits: bool = False
    splits: tuple[str, ...] = ()
    list_splits: Callable[[Path], list[str]] | None = None
    merge: MergeFn | None = None
    tokens: TokenTarget | None = None
    token_view: Callable[[Any, str], Any] | None = None  # (records reader, column) -> tokens
    # (reader) -> what made its dataset (lmdata._provenance), from metadata only, or None
    provenance: Callable[[Any], dict[str, Any] | None] | None = None
    document_files: bool = False  # its data are JSONL document files tokenize reads directly
    pass_name: bool = False
    # files beside a one-file dataset that belong to it (key -> keys), listed in its manifest
    companions: Callable[[str], list[str]] | None = None

    @property
    def record_target(self) -> bool:
        """Whether ``convert`` can write records (dicts) into this format."""
        return self.kind == "records"


# what a token sink sets itself, never a writer option of tokenize or convert
_SINK_SETS = frozenset({"overwrite", "vocab_size", "eod_id", "append_eod", "format", "columns"})


def writer_option_names(spec: FormatSpec) -> frozenset[str] | None:
    """The writer options ``tokenize`` and ``convert`` may pass to ``spec``'s writer (None:
    any)."""
    from lmdata._options import parameters

    taken = parameters(spec.writer)
    return None if taken is None else taken - _SINK_SETS


def check_writer_options(spec: FormatSpec, options: Mapping[str, Any], what: str) -> None:
    """An InvalidInputError for a writer option ``spec``'s writer does not take."""
    from lmdata._options import check_options

    taken = writer_option_names(spec)
    if taken is not None:
        check_options(options, taken, f"{what} (writer_options of {spec.name})")


def detector(check: Callable[[Path | str], bool], name: str) -> Callable[[Path | str], str | None]:
    """Turn a yes/no ``check(path)`` into a detector that returns ``name``."""

    def detect(path: Path | str) -> str | None:
        return name if check(path) else None  # a URL stays a URL

    detect.__qualname__ = f"detect[{name}]"
    return detect


class Lazy:
    """``"package.module:name"`` (or ``"package.module:Class.method"``) as a callable that
    imports the module on its first call; :meth:`resolve` gives the function itself (for its
    signature: :mod:`lmdata._options` checks options against it)."""

    def __init__(self, target: str) -> None:
        self.target = target
        modname, _, attr = target.partition(":")
        self.__name__ = self.__qualname__ = attr.rpartition(".")[2]
        self.__module__ = modname
        self.__doc__ = f"{target} (imported on first call)"
        self._found: Any = None

    def resolve(self) -> Any:
        """The function (or class) named by the target, imported now."""
        if self._found is None:
            modname, _, attr = self.target.partition(":")
            obj: Any = importlib.import_module(modname)
            for part in attr.split("."):  # "Class.method" too
                obj = getattr(obj, part)
            self._found = obj
        return self._found

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"lazy({self.target!r})"


def lazy(target: str) -> Lazy:
    """``target`` as a :class:`Lazy` callable.

    A spec's verbs are lazy so that loading a spec (to detect a format, or to look up its
    traits) imports no reader, writer or validator: ``lmdata.open`` of a flat-tokens dataset
    imports the flat-tokens reader and nothing of the other formats.
    """
    return Lazy(target)


# ---- token sinks shared by several formats ---------------------------------------------------


class PerDocumentSink:
    """A :class:`TokenSink` over a writer with ``write(item)``: ``make(doc)`` builds each item."""

    def __init__(self, writer: Writer, make: Callable[[np.ndarray], Any] | None = None) -> None:
        self.writer = writer
        self._make = make

    def write_many(self, flat: np.ndarray, lengths: np.ndarray, split: str) -> None:
        check_single_split(split, self.writer)
        pos = 0
        for n in lengths.tolist():
            doc = flat[pos : pos + n]
            pos += n
            self.writer.write(self._make(doc) if self._make else doc)

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


def check_single_split(split: str, writer: object) -> None:
    if split != "train":
        raise InvalidInputError(
            f"{getattr(writer, 'path', 'this output')}: the format has no {split!r} split; "
            "write the validation documents into a separate output"
        )


def token_dtype(vocab_size: int | None) -> str:
    """The narrowest unsigned dtype for ids below ``vocab_size`` (uint16 or uint32)."""
    return "uint16" if vocab_size is not None and vocab_size <= 1 << 16 else "uint32"


def column_sink(
    writer_factory: WriterFn, column: str = "tokens", declare_columns: bool = False
) -> SinkFn:
    """A token-target ``open`` for record formats: each document becomes ``{column: ids}``
    (ids in the narrowest dtype for the vocabulary; ``declare_columns`` passes
    ``columns={column: "ndarray:<dtype>"}`` to writers that take a column schema)."""

    def open_sink(
        path: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        vocab_size: int | None = None,
        eod_id: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> TokenSink:
        dtype = token_dtype(vocab_size)
        extra = {"columns": {column: f"ndarray:{dtype}"}} if declare_columns else {}
        opts = dict(options or {})
        if isinstance(opts.get("provenance"), dict):  # the Loader finds the column by it
            opts["provenance"] = {**opts["provenance"], "token_column": column}
        w = writer_factory(path, overwrite=overwrite, **extra, **opts)
        return PerDocumentSink(w, lambda d: {column: d.astype(dtype)})

    return open_sink
