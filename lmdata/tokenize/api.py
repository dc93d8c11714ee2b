"""``lmdata.tokenize``: documents to a token dataset, as one function call.

The same job as ``lmdata tokenize`` (the CLI calls this function): deterministic for any number
of workers, atomic (the output appears whole or not at all), resumable for inputs that are files
(local or URLs: a resume checks each input's size and version, such as its ETag).
URL inputs (files, folders, globs on object stores) are read by the workers themselves. Documents
given as objects (an iterable of strings or dicts, a Hugging Face ``datasets.Dataset``),
``memory://`` inputs when workers are other processes (that store lives in this process), and
tokenizers given as objects are first written to a temporary folder, since workers load them
from files.
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmdata import _json
from lmdata._options import unknown_option
from lmdata._provenance import command_scope, unsaved_tokenizer
from lmdata.errors import InvalidInputError
from lmdata.storage import is_url
from lmdata.tokenize.job import Summary, TokenizeJob

if TYPE_CHECKING:
    from lmdata._progress import OnProgress
    from lmdata.parallel import Executor

Paths = str | os.PathLike[str]


_COPY_BLOCK = 8 << 20  # bytes per read when a URL input is copied into the temporary folder


def _is_paths(inputs: Any) -> bool:
    if isinstance(inputs, (str, os.PathLike)):
        return True
    return isinstance(inputs, (list, tuple)) and all(
        isinstance(x, (str, os.PathLike)) for x in inputs
    )


def _documents(docs: Any, text_key: str) -> Iterable[Any]:
    """The documents of ``docs``: a Hugging Face ``datasets.Dataset`` (recognised by its
    ``column_names``, no import) narrowed to the text and id columns, else ``docs`` itself."""
    if isinstance(docs, Mapping):  # a DatasetDict iterates its split names, a dict its keys
        keys = ", ".join(map(str, list(docs)[:8]))
        raise InvalidInputError(
            f"inputs is a mapping ({type(docs).__name__} of {keys}); pass one split "
            "(dataset['train']) or a list of documents"
        )
    columns = getattr(docs, "column_names", None)
    if isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
        if text_key not in columns:
            raise InvalidInputError(
                f"the dataset has no column {text_key!r} (columns: {', '.join(columns)}); "
                "pass text_key="
            )
        keep = [c for c in (text_key, "id") if c in columns]
        select = getattr(docs, "select_columns", None)
        if callable(select) and len(keep) < len(columns):
            docs = select(keep)  # other columns are never decoded
    return docs


def _write_documents(docs: Iterable[Any], text_key: str, path: Path) -> Path:
    """Documents (strings, or dicts holding ``text_key``) as one JSONL file."""
    with open(path, "wb") as f:
        for i, d in enumerate(docs):
            if isinstance(d, str):
                d = {text_key: d}
            elif not isinstance(d, dict):
                raise InvalidInputError(
                    f"document {i} is a {type(d).__name__}; give strings or dicts with a "
                    f"{text_key!r} field (or paths as a str or a list of str)"
                )
            f.write(_json.dumps(d) + b"\n")
    return path


def _fetch(url: str, folder: Path, storage_options: dict[str, Any] | None) -> Path:
    """A local copy of the file or folder at ``url`` in ``folder``, object for object under the
    same names, so it tokenizes exactly as the URL would."""
    from lmdata.storage import basename, join, require_exists, resolve
    from lmdata.tokenize.sources import open_input

    require_exists(url, storage_options)
    store, key = resolve(url, storage_options)
    dest = folder / (basename(key) or "input")
    pending = [(key, dest)]
    while pending:
        k, d = pending.pop()
        if not store.is_dir(k):
            d.parent.mkdir(parents=True, exist_ok=True)
            with open_input(store.url(k), storage_options) as src, open(d, "wb") as f:
                shutil.copyfileobj(src, f, _COPY_BLOCK)  # past the range cache, as workers read
            continue
        d.mkdir(parents=True, exist_ok=True)
        pending.extend((join(k, n), d / n) for n in store.list(k))
    return dest


def _sources(
    sources: list[Paths],
    temp: Path,
    storage_options: dict[str, Any] | None,
    copy_memory: bool,
    origins: dict[str, str],
) -> list[Paths]:
    """``sources`` as the workers read them: local paths and URLs as they are (a missing local
    path is an error), ``memory://`` ones copied locally when ``copy_memory`` (each copy's URL
    recorded in ``origins``, which is what ``resume`` compares)."""
    from lmdata.storage import scheme

    out: list[Paths] = []
    for s in sources:
        if scheme(s) == "memory" and copy_memory:
            folder = Path(tempfile.mkdtemp(prefix="url-", dir=temp))
            copy = _fetch(os.fspath(s), folder, storage_options)
            origins[str(copy)] = os.fspath(s)
            out.append(copy)
        elif not is_url(s) and not os.path.lexists(s):
            raise InvalidInputError(
                f"no such file or folder: {str(s)[:80]!r}. Strings in a list are paths; pass "
                'documents as an iterator (iter(texts)) or as dicts ({"text": ...})'
            )
        else:
            out.append(s)
    return out


def _tiktoken_file(enc: Any, folder: Path) -> str:
    """A tiktoken ``Encoding`` as a ``*.tiktoken`` ranks file, if loading that file gives the
    same encoding back (its split pattern and special tokens), else an error."""
    import base64

    from lmdata.tokenize.tokenizers import TiktokenTokenizer

    path = folder / f"{enc.name}.tiktoken"
    ranks = sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1])
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))
    back = TiktokenTokenizer(path)._enc
    if back._pat_str != enc._pat_str or back._special_tokens != enc._special_tokens:
        raise InvalidInputError(
            f"the tiktoken encoding {enc.name!r} has its own split pattern or special tokens, "
            "which a *.tiktoken file cannot hold; pass an OpenAI encoding (cl100k_base, "
            "o200k_base, ...) or a tokenizer file"
        )
    return str(path)


def _tokenizer_file(tokenizer: Any, folder: Path) -> str:
    """A tokenizer spec workers can load: the spec itself, or an object saved into ``folder``
    (a Hugging Face ``tokenizers.Tokenizer``, a transformers fast tokenizer, a tiktoken
    ``Encoding``)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        return os.fspath(tokenizer)
    spec = getattr(tokenizer, "spec", None)
    if isinstance(spec, str):  # an lmdata tokenizer
        return spec
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # transformers' fast ones
    if callable(getattr(backend, "save", None)) and callable(getattr(backend, "to_str", None)):
        path = folder / "tokenizer.json"
        backend.save(str(path))
        return str(path)
    if hasattr(tokenizer, "_mergeable_ranks") and hasattr(tokenizer, "_pat_str"):
        return _tiktoken_file(tokenizer, folder)
    raise InvalidInputError(
        f"cannot tokenize with a {type(tokenizer).__name__}: pass 'bytes', a tokenizer file "
        "(tokenizer.json, *.tiktoken, *.model), a tokenizers.Tokenizer, a transformers fast "
        "tokenizer or a tiktoken Encoding"
    )


DEFAULT_FORMAT = "flat-tokens"  # seqax's: the one a loader reads fastest


def tokenize(
    inputs: Paths | list[Paths] | Iterable[Any],
    output: Paths,
    *,
    format: str | None = None,
    tokenizer: Any = "bytes",
    text_key: str = "text",
    validation: Paths | list[Paths] | None = None,
    validation_fraction: float = 0.0,
    eod: str | None = None,
    eod_id: int | None = None,
    append_eod: bool | None = None,
    special_tokens: bool | None = None,
    skip_invalid: bool = False,
    source_format: str | None = None,
    batch_docs: int = 256,
    encoder: str = "auto",
    workers: int | None = None,
    engine: str = "processes",
    address: str | None = None,
    executor: Executor | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: OnProgress | None = None,
    storage_options: dict[str, Any] | None = None,
    writer_options: dict[str, Any] | None = None,
    to: str | None = None,
    **legacy: Any,
) -> Summary:
    """Tokenize ``inputs`` into a token dataset of ``format`` at ``output``; return what was
    done (``documents_read``, ``documents_written``, ``tokens``, ...).

    ``format`` defaults to flat-tokens (``to=`` is its old name: deprecated). ``inputs``: a
    path, a URL (``s3://``, ``memory://``, ...) or a list of them (JSONL[.gz|.zst] files or
    folders, Dolma trees, Parquet, text files, lmdata record datasets), or documents: any
    other iterable of strings or of dicts holding ``text_key`` (a generator, a list of dicts,
    a Hugging Face ``datasets.Dataset``). ``tokenizer``: ``"bytes"``, a local file
    (``tokenizer.json``, ``*.tiktoken``, ``*.model``), or a ``tokenizers.Tokenizer``,
    transformers fast tokenizer or tiktoken ``Encoding`` object. ``output`` may be a URL;
    ``storage_options`` are for the URLs of inputs and output. The other options are the
    CLI's (``special_tokens`` is ``--special-tokens/--no-special-tokens``); ``writer_options``
    go to the format's writer (``{"chunk_tokens": ..., "compression": ...}``; given as
    keywords of their own they are deprecated). An unknown option is an InvalidInputError.
    ``encoder`` is ``"auto"`` (the fast encoder when installed and exact for the tokenizer,
    else the reference), ``"fast"`` or ``"hf"`` (the tokenizer's reference library); every
    one writes the same tokens.

    The output is the same for every ``engine`` and number of ``workers``, appears only when
    the job succeeds, and records the tokenizer that made it (``lmdata.info(output)``).
    ``executor`` (an ``lmdata.parallel.Executor``) runs the work in place of the one
    ``engine``, ``workers`` and ``address`` describe. ``progress`` receives
    ``lmdata.Progress`` events of the phase "tokenize": input bytes read (of their
    total), then documents and tokens.
    """
    from lmdata.parallel import check_choice, executor_for
    from lmdata.tokenize.pipeline import tokenize as run

    to, writer_options = _target(format, to, writer_options, legacy)
    if validation is not None and not _is_paths(validation):
        raise InvalidInputError("validation= takes a path or a list of paths")
    if isinstance(validation, (str, os.PathLike)):
        validation = [validation]
    temp = Path(tempfile.mkdtemp(prefix="lmdata-tokenize-"))
    # memory:// lives in this process: other processes read a local copy of it
    check_choice(executor, engine, workers, address)
    in_process = executor_for(executor, engine, workers, address).in_process
    origins: dict[str, str] = {}  # local copies of URL inputs -> their URLs
    try:
        if _is_paths(inputs):
            listed = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
            sources = _sources(listed, temp, storage_options, not in_process, origins)  # type: ignore[arg-type]
        else:
            if resume:
                raise InvalidInputError("resume=True needs inputs that are files, not documents")
            docs = _documents(inputs, text_key)
            sources = [_write_documents(docs, text_key, temp / "documents.jsonl")]
        held = _sources(list(validation or []), temp, storage_options, not in_process, origins)
        job = TokenizeJob(
            to=to,
            tokenizer=_tokenizer_file(tokenizer, temp),
            text_key=text_key,
            batch_docs=batch_docs,
            validation_fraction=validation_fraction,
            skip_invalid=skip_invalid,
            eod=eod,
            eod_id=eod_id,
            append_eod=append_eod,
            add_special_tokens=special_tokens,
            source_format=source_format,
            writer_options=writer_options,
        )
        saved = job.tokenizer if Path(job.tokenizer).parent == temp else None
        with (
            command_scope(_describe(inputs, output, job, tokenizer), outermost=True),
            unsaved_tokenizer(saved),
        ):
            return run(
                sources,
                output,
                job,
                validation_sources=held,
                workers=workers,
                engine=engine,
                address=address,
                executor=executor,
                resume=resume,
                overwrite=overwrite,
                progress=progress,
                storage_options=storage_options if is_url(output) else None,
                source_options=storage_options,
                origins=origins,
                encoder=encoder,
            )
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _target(
    format: str | None,
    to: str | None,
    writer_options: dict[str, Any] | None,
    legacy: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """The target format and its writer options, from the names of today and the deprecated
    ones (``to=``, writer options as keywords), each warned; an unknown keyword is an
    InvalidInputError naming tokenize's options."""
    from lmdata import formats
    from lmdata.formats._spec import writer_option_names

    if to is not None:
        warnings.warn(
            "lmdata.tokenize(to=) is deprecated and goes in lmdata 0.3; pass format=",
            DeprecationWarning,
            stacklevel=3,
        )
        if format is not None and format != to:
            raise InvalidInputError(f"to={to!r} and format={format!r}: give the format once")
    name = format or to or DEFAULT_FORMAT
    opts = dict(writer_options or {})
    if legacy:
        own = set(inspect.signature(tokenize).parameters) - {"inputs", "output", "legacy", "to"}
        taken = writer_option_names(formats.spec(name))
        for key, value in legacy.items():
            if taken is not None and key not in taken:
                raise unknown_option(key, own, "lmdata.tokenize")
            warnings.warn(
                f"lmdata.tokenize({key}=...) is deprecated and goes in lmdata 0.3; pass "
                f"writer_options={{{key!r}: ...}}",
                DeprecationWarning,
                stacklevel=3,
            )
            opts[key] = value
    formats.check_writer_options(formats.spec(name), opts, "lmdata.tokenize")
    return name, opts


def _describe(inputs: Any, output: Paths, job: TokenizeJob, tokenizer: Any) -> str:
    """How a Python call is recorded in the dataset's provenance."""
    if isinstance(inputs, (str, os.PathLike)):
        what = repr(os.fspath(inputs))
    elif _is_paths(inputs):
        what = repr([os.fspath(x) for x in inputs])
    else:
        what = f"<{type(inputs).__name__} of documents>"
    tok = (
        repr(job.tokenizer)
        if isinstance(tokenizer, (str, os.PathLike)) or hasattr(tokenizer, "spec")
        else f"<{type(tokenizer).__name__}>"
    )
    return f"lmdata.tokenize({what}, {os.fspath(output)!r}, format={job.to!r}, tokenizer={tok})"
