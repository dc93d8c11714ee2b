"""``lmdata.open`` and friends: dispatch to the format specs through the registry."""

from __future__ import annotations

import os
from typing import Any

from lmdata import formats
from lmdata.errors import InvalidInputError
from lmdata.formats import FormatSpec
from lmdata.formats._spec import Progress
from lmdata.storage import options_scope, require_exists, resolve

# storage_options= (every verb): fsspec options for URLs (s3://, gs://, ...), such as
# {"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}; credentials are otherwise
# found where fsspec looks (environment, config files). Readers and writers keep them.


def detect(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> str:
    """The format name of the dataset at ``path``."""
    with options_scope(storage_options):
        return formats.detect(require_exists(path, storage_options))


def _spec_at(path: Any, format: str | None) -> FormatSpec:
    return formats.spec(format) if format else formats.spec(formats.detect(path))


def _named(spec: FormatSpec, options: dict[str, Any]) -> dict[str, Any]:
    if spec.pass_name:  # one implementation behind several names (the MDS family)
        options.setdefault("format", spec.name)
    return options


def open(
    path: str | os.PathLike[str],
    format: str | None = None,
    split: str | None = None,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Open the dataset at ``path`` and return a reader.

    ``format`` skips detection. ``split`` picks a split where the format has them
    (flat-tokens: ``train`` by default, or ``validation``; MDS: a sub-folder with its own
    index). ``token_column`` gives the token-sequence view of a records dataset whose column
    holds token arrays (MDS, Atlas). Other options go to the format's reader (for example
    ``allow_unsafe_pickle=True`` for formats that store pickles).
    """
    with options_scope(storage_options):
        return _open(require_exists(path, storage_options), format, split, options)


def _open(p: Any, format: str | None, split: str | None, options: dict[str, Any]) -> Any:
    spec = _spec_at(p, format)
    if split is not None:
        if not spec.has_splits:
            raise InvalidInputError(f"{spec.name} datasets have no splits; drop --split / split=")
        options["split"] = split
    token_column = options.pop("token_column", None)
    if token_column is not None and spec.kind == "tokens":
        raise InvalidInputError(
            f"{spec.name} datasets are token sequences already; drop token_column="
        )
    reader = spec.open(p, **_named(spec, options))
    return reader if token_column is None else token_view(reader, token_column)


def token_view(reader: Any, column: str) -> Any:
    """The token-sequence view of a records ``reader`` whose ``column`` holds token ids: the
    format's own view where it has one (MDS reads lengths from its headers), else a generic one
    that finds the lengths in one pass on first use."""
    from lmdata.formats._token_view import TokenColumn

    name = getattr(reader, "format", None)
    spec = formats.spec(name) if isinstance(name, str) and name in formats.names() else None
    view = spec.token_view if spec is not None and spec.token_view is not None else TokenColumn
    return view(reader, column)


def writer(
    path: str | os.PathLike[str],
    format: str,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """A new writer of ``format`` at ``path`` (a context manager: ``with lmdata.writer(...)``)."""
    spec = formats.spec(format)
    if storage_options:
        resolve(path, storage_options)  # refuses options given for a local path
    with options_scope(storage_options):
        return spec.writer(path, **_named(spec, options))


def validate(
    path: str | os.PathLike[str],
    format: str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> list[str]:
    """Every problem found in the dataset at ``path``; an empty list means valid.

    ``progress(done, total)`` is called as the check goes, in bytes of the dataset's data:
    first with ``done=0`` to announce the total, then per shard, chunk, file or MiB, never
    backwards, last with ``done == total`` when the check got to the end."""
    with options_scope(storage_options):
        p = require_exists(path, storage_options)
        spec = _spec_at(p, format)
        return list(spec.validate(p, **_reporting(progress), **_named(spec, options)))


def _reporting(progress: Progress | None) -> dict[str, Any]:
    return {} if progress is None else {"progress": progress}


def info(
    path: str | os.PathLike[str],
    format: str | None = None,
    storage_options: dict[str, Any] | None = None,
    *,
    scan: bool = True,
    progress: Progress | None = None,
    **options: Any,
) -> dict[str, Any]:
    """A summary of the dataset at ``path`` (format, counts, sizes, codecs). ``scan=False``
    leaves out what takes a pass over the data (the documents of JSONL files, the largest id
    of a ``.pbin``): for callers that need only the metadata, sizes and provenance.
    ``progress(done, total)``: as for ``validate``, in bytes of the data summarised."""
    with options_scope(storage_options):
        p = require_exists(path, storage_options)
        spec = _spec_at(p, format)
        light = {} if scan else {"scan": False}  # a spec's info may predate the option
        return spec.info(p, **light, **_reporting(progress), **_named(spec, options))


def merge(
    inputs: list[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    format: str | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> str:
    """Join datasets of one format into one at ``output``; returns a one-line summary.
    URLs (where the format's merge supports them) use ``storage_options``.
    ``progress(done, total)``: as for ``validate``, in bytes of the inputs' data joined."""
    if not inputs:
        raise InvalidInputError("merge needs at least one input")
    with options_scope(storage_options):
        spec = _spec_at(require_exists(inputs[0], storage_options), format)
        if spec.merge is None:
            mergeable = [s.name for s in formats.specs() if s.merge is not None]
            raise InvalidInputError(
                f"{spec.name} datasets cannot be merged; formats with merge: {', '.join(mergeable)}"
            )
        return spec.merge(
            [str(p) for p in inputs], str(output), overwrite=overwrite, **_reporting(progress)
        )
