"""``lmdata.open`` and friends: dispatch to the format specs through the registry."""

from __future__ import annotations

import os
from typing import Any

from lmdata import _manifest, formats
from lmdata._options import check_call, checked, parameters
from lmdata._progress import OnProgress, Progress
from lmdata.errors import FormatError, InvalidInputError, LmdataError
from lmdata.formats import FormatSpec
from lmdata.formats._spec import MergeSummary
from lmdata.protocols import Records, TokenSequences, Writer
from lmdata.storage import options_scope, require_exists, resolve

# storage_options= (every verb): fsspec options for URLs (s3://, gs://, ...), such as
# {"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}; credentials are otherwise
# found where fsspec looks (environment, config files). Readers and writers keep them.


@checked("lmdata.detect")
def detect(path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> str:
    """The format name of the dataset at ``path``."""
    with options_scope(storage_options):
        return formats.detect(require_exists(path, storage_options))


def _spec_at(path: Any, format: str | None) -> FormatSpec:
    if format:
        return formats.spec(format)
    try:
        return formats.spec(formats.detect(path))
    except FormatError:
        # damaged past detection: the format its manifest records, so checks can say where
        recorded = _manifest.recorded_format(path)
        if recorded is None:
            raise
        return formats.spec(recorded)


def _named(spec: FormatSpec, options: dict[str, Any]) -> dict[str, Any]:
    if spec.pass_name:  # one implementation behind several names (the MDS family)
        options.setdefault("format", spec.name)
    return options


# a dataset without pickles has nothing to trust: the CLI's --allow-unsafe-pickle (and this
# option) is accepted for every format and dropped where the verb has no use for it
_EVERY_FORMAT = ("allow_unsafe_pickle",)


def _options(
    spec: FormatSpec, verb: str, options: dict[str, Any], own: tuple[str, ...]
) -> dict[str, Any]:
    """``options`` for ``spec``'s ``verb``, refused by name (InvalidInputError with the valid
    ones and a did-you-mean) when the verb does not take one; ``own`` are the caller's."""
    fn = getattr(spec, verb)
    taken = parameters(fn)
    out = dict(options)
    every = () if verb == "writer" else _EVERY_FORMAT
    for name in every:
        if taken is not None and name in out and name not in taken:
            del out[name]
    check_call(fn, out, f"lmdata.{verb} of {spec.name}", also=(*own, *every))
    return out


_OPEN = ("format", "split", "storage_options", "verify", "token_column")


def open(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    split: str | None = None,
    storage_options: dict[str, Any] | None = None,
    verify: bool = True,
    token_column: str | None = None,
    **options: Any,
) -> Records | TokenSequences:
    """Open the dataset at ``path`` and return a reader.

    ``format`` skips detection. ``split`` picks a split where the format has them
    (flat-tokens: ``train`` by default, or ``validation``; MDS: a sub-folder with its own
    index). ``token_column`` gives the token-sequence view of a records dataset whose column
    holds token arrays (MDS, Atlas). Other options go to the format's reader (for example
    ``allow_unsafe_pickle=True`` for formats that store pickles). A dataset with a manifest
    (every lmdata writer leaves one) is checked against it first, by names and sizes: a
    deleted, added, truncated or grown file is a CorruptDataError naming it, unless
    ``verify=False`` (to salvage what is intact). An option the format's reader does not take
    is an InvalidInputError naming the ones it does.
    """
    if token_column is not None:
        options["token_column"] = token_column
    with options_scope(storage_options):
        return _open(require_exists(path, storage_options), format, split, options, verify)


def _open(
    p: Any, format: str | None, split: str | None, options: dict[str, Any], verify: bool = True
) -> Any:
    spec = _spec_at(p, format)
    options = dict(options)
    token_column = options.pop("token_column", None)
    options = _options(spec, "open", options, _OPEN)
    if split is not None:
        if not spec.has_splits:
            raise InvalidInputError(f"{spec.name} datasets have no splits; drop --split / split=")
        options["split"] = split
    if token_column is not None and spec.kind == "tokens":
        raise InvalidInputError(
            f"{spec.name} datasets are token sequences already; drop token_column="
        )
    local = resolve(p)[0].can_mmap
    if verify and local:  # one walk of the folder, before the reader: its error comes first
        _manifest.verify(p, spec, split)
    try:
        reader = spec.open(p, **_named(spec, options))
    except (LmdataError, OSError):
        if verify and not local:  # damaged: the difference from the manifest says the most
            _manifest.verify(p, spec, split)
        raise
    if verify and not local:  # after the reader: the listings it made serve the check
        try:
            _manifest.verify(p, spec, split, reader)
        except BaseException:
            close = getattr(reader, "close", None)
            if close is not None:
                close()
            raise
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


def provenance(reader: Any) -> dict[str, Any] | None:
    """What made the dataset ``reader`` reads (:mod:`lmdata._provenance`: the tokenizer, the
    column of token ids), from its metadata alone, or None where nothing was recorded (a token
    view asks the records reader it wraps)."""
    target = getattr(reader, "records", reader)
    name = getattr(target, "format", None)
    if not isinstance(name, str) or name not in formats.names():
        return None
    lookup = formats.spec(name).provenance
    if lookup is None:
        return None
    try:
        got = lookup(target)
    except (OSError, AttributeError, LmdataError):  # unreadable metadata: no record
        return None
    return got if isinstance(got, dict) else None


def writer(
    path: str | os.PathLike[str],
    format: str,
    *,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Writer:
    """A new writer of ``format`` at ``path`` (a context manager: ``with lmdata.writer(...)``).
    Options go to the format's writer; one it does not take is an InvalidInputError naming
    the ones it does."""
    spec = formats.spec(format)
    options = _options(spec, "writer", options, ("format", "storage_options"))
    if storage_options:
        resolve(path, storage_options)  # refuses options given for a local path
    with options_scope(storage_options):
        return spec.writer(path, **_named(spec, options))


def validate(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
    deep: bool = False,
    **options: Any,
) -> list[str]:
    """Every problem found in the dataset at ``path``; an empty list means valid.

    Where the dataset has a manifest, its files are compared with it by names and sizes (a
    deleted, added, truncated or grown file is named); ``deep=True`` also hashes every file
    (in parallel) and names the first block that differs from what its writer wrote.
    ``progress`` receives ``lmdata.Progress`` events of the phase "validate" as the
    check goes, in bytes of the dataset's data (and, with ``deep``, of the files hashed):
    first with ``done=0`` to announce the total, then per shard, chunk, file or MiB, never
    backwards, last with ``done == total`` when the check got to the end. An option the
    format's check does not take (``eod_idd=`` for ``eod_id=``) is an InvalidInputError
    naming the ones it does."""
    with options_scope(storage_options):
        p = require_exists(path, storage_options)
        spec = _spec_at(p, format)
        options = _options(spec, "validate", options, _VALIDATE)

        def run(prog: OnProgress | None) -> list[str]:
            return list(spec.validate(p, **_reporting(prog), **_named(spec, dict(options))))

        return _manifest.problems(p, deep, progress, run)


_VALIDATE = ("format", "storage_options", "progress", "deep")


def _reporting(progress: OnProgress | None) -> dict[str, Any]:
    return {} if progress is None else {"progress": progress}


def info(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    scan: bool = True,
    progress: OnProgress | None = None,
    **options: Any,
) -> dict[str, Any]:
    """A summary of the dataset at ``path`` (format, counts, sizes, codecs). ``scan=False``
    leaves out what takes a pass over the data (the documents of JSONL files, the largest id
    of a ``.pbin``): for callers that need only the metadata, sizes and provenance.
    ``manifest`` says when the dataset's manifest was made and what it lists (``"none"``).
    ``progress``: as for ``validate`` (phase "info"), in bytes of the data summarised.
    ``model_vocab_size`` (of token datasets) is the vocabulary a model needs: the recorded
    tokenizer's, else the largest id + 1 (with ``scan``)."""
    from lmdata._provenance import model_vocab_size

    with options_scope(storage_options):
        p = require_exists(path, storage_options)
        spec = _spec_at(p, format)
        options = _options(spec, "info", options, ("format", "storage_options", "scan", "progress"))
        out = spec.info(p, scan=scan, **_reporting(progress), **_named(spec, options))
        out["manifest"] = _manifest.summary(p)
        needed = model_vocab_size(out)
        if needed is not None:
            out["model_vocab_size"] = needed
        return out


@checked("lmdata.merge")
def merge(
    inputs: list[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    format: str | None = None,
    *,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
) -> MergeSummary:
    """Join datasets of one format into one at ``output``; returns what was joined (a
    :class:`~lmdata.formats._spec.MergeSummary`; ``.line()`` says it in one line). The
    tokenizer record of the inputs is kept (inputs made with different tokenizers are
    refused). URLs (where the format's merge supports them) use ``storage_options``.
    ``progress``: as for ``validate`` (phase "merge"), in bytes of the inputs' data joined."""
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


def write_manifest(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: OnProgress | None = None,
    workers: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Write the manifest of a dataset another tool wrote, once ``validate`` finds it
    valid (else CorruptDataError listing the problems); returns what ``info`` shows of
    it. An existing manifest is an OutputExistsError unless ``overwrite``. ``progress``
    (phase "manifest") counts the bytes validated, then those hashed (on ``workers``
    threads)."""
    with options_scope(storage_options):
        p = require_exists(path, storage_options)
        spec = _spec_at(p, format)
        own = ("format", "storage_options", "overwrite", "progress", "workers")
        options = _options(spec, "validate", options, own)
        reading = parameters(spec.open)  # the options the check and the reader share
        opening = {k: v for k, v in options.items() if reading is None or k in reading}
        hashed_from = [0]

        def problems() -> list[str]:
            def prog(e: Progress) -> None:
                hashed_from[0] = e.total or 0
                assert progress is not None
                progress(Progress(e.done, e.total, e.unit, "manifest"))

            return list(
                spec.validate(
                    p,
                    **_reporting(prog if progress is not None else None),
                    **_named(spec, dict(options)),
                )
            )

        def records() -> int | None:
            with _open(p, spec.name, None, opening, verify=False) as r:
                return len(r)

        def hash_progress(e: Progress) -> None:
            assert progress is not None
            whole = hashed_from[0] + (e.total or 0)
            progress(Progress(hashed_from[0] + e.done, whole, e.unit, "manifest"))

        _manifest.create(
            p,
            spec,
            overwrite=overwrite,
            validate=problems,
            records=records,
            progress=hash_progress if progress is not None else None,
            workers=workers,
        )
        out = _manifest.summary(p)
        assert isinstance(out, dict)
        return out


def check_manifest(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
    workers: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """``(what info shows of the manifest, every difference from it)``: names and sizes from
    one listing, every block hashed on ``workers`` threads (``progress``: phase
    "manifest --check", in bytes); InvalidInputError without one."""
    with options_scope(storage_options):
        p = require_exists(path, storage_options)
        _found, problems = _manifest.check(p, progress, workers)
        out = _manifest.summary(p)
        assert isinstance(out, dict)
        return out, problems


def manifest_summary(
    path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> dict[str, Any] | str:
    """What ``info`` shows of the dataset's manifest (``"none"`` without one)."""
    with options_scope(storage_options):
        return _manifest.summary(require_exists(path, storage_options))
