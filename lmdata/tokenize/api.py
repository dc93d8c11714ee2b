"""``lmdata.tokenize``: documents to a token dataset, as one function call.

The same job as ``lmdata tokenize`` (the CLI calls this function): deterministic for any number
of workers, atomic (the output appears whole or not at all), resumable for file inputs. Inputs
that are not files (an iterable of strings or dicts, a Hugging Face ``datasets.Dataset``) and
tokenizers given as objects are first written to a temporary folder, since worker processes
load both from files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lmdata import _json
from lmdata._provenance import command_scope
from lmdata.errors import InvalidInputError
from lmdata.tokenize.job import Summary, TokenizeJob

Paths = str | os.PathLike[str]


def _is_paths(inputs: Any) -> bool:
    if isinstance(inputs, (str, os.PathLike)):
        return True
    return isinstance(inputs, (list, tuple)) and all(
        isinstance(x, (str, os.PathLike)) for x in inputs
    )


def _write_documents(docs: Iterable[Any], text_key: str, folder: Path) -> Path:
    """Documents (strings, or dicts holding ``text_key``) as one JSONL file."""
    path = folder / "documents.jsonl"
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


def _tokenizer_file(tokenizer: Any, folder: Path) -> str:
    """A tokenizer spec workers can load: the spec itself, or an object saved into ``folder``
    (a Hugging Face ``tokenizers.Tokenizer`` or a transformers fast tokenizer)."""
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
    raise InvalidInputError(
        f"cannot tokenize with a {type(tokenizer).__name__}: pass 'bytes', a tokenizer file "
        "(tokenizer.json, *.tiktoken, *.model), a tokenizers.Tokenizer or a transformers fast "
        "tokenizer"
    )


def tokenize(
    inputs: Paths | list[Paths] | Iterable[Any],
    output: Paths,
    *,
    format: str,
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
    workers: int | None = None,
    engine: str = "processes",
    address: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: Callable[[dict[str, float]], None] | None = None,
    storage_options: dict[str, Any] | None = None,
    **writer_options: Any,
) -> Summary:
    """Tokenize ``inputs`` into a ``format`` token dataset at ``output``; return what was done
    (``documents_read``, ``documents_written``, ``tokens``, ...).

    ``inputs``: a path or a list of paths (JSONL[.gz|.zst] files or folders, Dolma trees,
    Parquet, text files, lmdata record datasets), or documents: any other iterable of strings
    or of dicts holding ``text_key`` (a generator, a list of dicts, a Hugging Face
    ``datasets.Dataset``). ``tokenizer``: ``"bytes"``, a local file (``tokenizer.json``,
    ``*.tiktoken``, ``*.model``), or a ``tokenizers.Tokenizer`` / transformers fast tokenizer
    object. ``output`` may be a URL (``storage_options`` for its store). The other options
    are the CLI's (``special_tokens`` is ``--special-tokens/--no-special-tokens``);
    ``writer_options`` go to the format's writer (``chunk_tokens``, ``compression``).

    The output is the same for every ``engine`` and number of ``workers``, appears only when
    the job succeeds, and records the tokenizer that made it (``lmdata.info(output)``).
    """
    from lmdata.tokenize.pipeline import tokenize as run

    if validation is not None and not _is_paths(validation):
        raise InvalidInputError("validation= takes a path or a list of paths")
    temp = Path(tempfile.mkdtemp(prefix="lmdata-tokenize-"))
    try:
        if _is_paths(inputs):
            sources = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
            missing = next((s for s in sources if not os.path.lexists(s)), None)
            if missing is not None:
                raise InvalidInputError(
                    f"no such file or folder: {str(missing)[:80]!r}. Strings in a list are "
                    "paths; pass documents as an iterator (iter(texts)) or as dicts "
                    '({"text": ...})'
                )
        else:
            if resume:
                raise InvalidInputError("resume=True needs inputs that are files, not documents")
            sources = [_write_documents(inputs, text_key, temp)]  # type: ignore[arg-type]
        if isinstance(validation, (str, os.PathLike)):
            validation = [validation]
        job = TokenizeJob(
            to=format,
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
        with command_scope(_describe(inputs, output, job), outermost=True):
            return run(
                sources,  # type: ignore[arg-type]
                output,
                job,
                validation_sources=list(validation or []),
                workers=workers,
                engine=engine,
                address=address,
                resume=resume,
                overwrite=overwrite,
                progress=progress,
                storage_options=storage_options,
            )
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _describe(inputs: Any, output: Paths, job: TokenizeJob) -> str:
    """How a Python call is recorded in the dataset's provenance."""
    if isinstance(inputs, (str, os.PathLike)):
        what = repr(os.fspath(inputs))
    elif _is_paths(inputs):
        what = repr([os.fspath(x) for x in inputs])
    else:
        what = f"<{type(inputs).__name__} of documents>"
    return (
        f"lmdata.tokenize({what}, {os.fspath(output)!r}, format={job.to!r}, "
        f"tokenizer={job.tokenizer!r})"
    )
