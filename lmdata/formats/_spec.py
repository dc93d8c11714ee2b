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

Kind = Literal["records", "tokens"]


class TokenSink(Protocol):
    """What tokenize and convert write into: documents as one flat array plus their lengths."""

    def write_many(self, flat: np.ndarray, lengths: np.ndarray, split: str) -> None:
        """Append documents (``flat`` is their concatenation) to ``split``."""
        ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class TokenTarget:
    """How token sequences are written into a format.

    ``open(path, *, overwrite, vocab_size, eod_id, options)`` returns a :class:`TokenSink`;
    ``vocab_size`` is the tokenizer's (or ``max_token_id + 1`` of a source being converted) so
    the format can pick its token width; ``eod_id`` is the end-of-document id the documents
    carry, if any (recorded where the format records it; documents arrive with it appended).
    """

    open: Callable[..., TokenSink]
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
    open: Callable[..., Any]
    writer: Callable[..., Any]
    validate: Callable[..., list[str]]
    info: Callable[..., dict[str, Any]]
    aliases: tuple[str, ...] = ()
    has_splits: bool = False
    splits: tuple[str, ...] = ()
    list_splits: Callable[[Path], list[str]] | None = None
    merge: Callable[..., str] | None = None
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


def detector(check: Callable[[Path | str], bool], name: str) -> Callable[[Path | str], str | None]:
    """Turn a yes/no ``check(path)`` into a detector that returns ``name``."""

    def detect(path: Path | str) -> str | None:
        return name if check(path) else None  # a URL stays a URL

    detect.__qualname__ = f"detect[{name}]"
    return detect


def lazy(target: str) -> Callable[..., Any]:
    """``"package.module:name"`` (or ``"package.module:Class.method"``) as a callable that
    imports the module on its first call.

    A spec's verbs are lazy so that loading a spec (to detect a format, or to look up its
    traits) imports no reader, writer or validator: ``lmdata.open`` of a flat-tokens dataset
    imports the flat-tokens reader and nothing of the other formats.
    """
    modname, _, attr = target.partition(":")
    found: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not found:
            obj: Any = importlib.import_module(modname)
            for part in attr.split("."):  # "Class.method" too
                obj = getattr(obj, part)
            found.append(obj)
        return found[0](*args, **kwargs)

    call.__name__ = call.__qualname__ = attr.rpartition(".")[2]
    call.__module__ = modname
    call.__doc__ = f"{target} (imported on first call)"
    return call


# ---- token sinks shared by several formats ---------------------------------------------------


class PerDocumentSink:
    """A :class:`TokenSink` over a writer with ``write(item)``: ``make(doc)`` builds each item."""

    def __init__(self, writer: Any, make: Callable[[np.ndarray], Any] | None = None) -> None:
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


def check_single_split(split: str, writer: Any) -> None:
    if split != "train":
        raise InvalidInputError(
            f"{getattr(writer, 'path', 'this output')}: the format has no {split!r} split; "
            "write the validation documents into a separate output"
        )


def token_dtype(vocab_size: int | None) -> str:
    """The narrowest unsigned dtype for ids below ``vocab_size`` (uint16 or uint32)."""
    return "uint16" if vocab_size is not None and vocab_size <= 1 << 16 else "uint32"


def column_sink(
    writer_factory: Callable[..., Any], column: str = "tokens", declare_columns: bool = False
) -> Callable[..., TokenSink]:
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
