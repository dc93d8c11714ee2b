"""``lmdata decontaminate``'s config (a YAML/JSON file, command-line flags on top), checked in
one place: see :mod:`lmdata.dolma.decontam`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmdata.dolma._checks import as_int, as_list, options
from lmdata.dolma._keys import DECONTAM, check_keys
from lmdata.dolma._minhash_config import MAX_NGRAM
from lmdata.dolma.config import resolve_documents
from lmdata.errors import InvalidInputError
from lmdata.formats.dolma._paths import attribute_path


@dataclass(frozen=True)
class DecontamConfig:
    """Flag the spans of ``documents`` that match evaluation text (``against``: JSONL or
    Parquet files whose ``text_key`` holds the texts, or plain text files, each one text) by
    word ``ngram``-grams; ``attributes/<name>/`` with the attribute ``name``."""

    documents: tuple[str, ...]
    against: tuple[str, ...]
    name: str = "decontam"
    text_key: str = "text"
    ngram: int = 13
    document_dir: str = "documents"
    processes: int = 1
    work_dir: str | None = None
    evals: str = ""  # the evaluation n-grams' digest (set by decontaminate: a job's identity)
    storage_options: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    mode = "decontam"  # what _spans.read takes of a document: its text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecontamConfig:
        check_keys(d, DECONTAM, "decontaminate config")
        docs = as_list(d.get("documents"), "documents")
        against = as_list(d.get("against"), "against")
        if not docs:
            raise InvalidInputError("decontaminate: `documents` (globs or a dataset) is required")
        if not against:
            raise InvalidInputError(
                "decontaminate: `against` (evaluation files: JSONL, Parquet or plain text) "
                "is required"
            )
        name = d.get("name") or "decontam"
        key = d.get("text_key") or "text"
        for what, v in (("name", name), ("text_key", key)):
            if not isinstance(v, str) or ("/" in v and what == "name"):
                raise InvalidInputError(f"decontaminate: `{what}` must be a name, got {v!r}")
        n = as_int(d.get("ngram", 13), "ngram", 1)
        if n > MAX_NGRAM:
            raise InvalidInputError(f"decontaminate: ngram must be at most {MAX_NGRAM}, got {n}")
        wd = d.get("work_dir")
        ddir = d.get("document_dir") or "documents"
        if not isinstance(ddir, str) or "/" in ddir:
            raise InvalidInputError(f"document_dir must be one path component, got {ddir!r}")
        return cls(
            documents=docs,
            against=against,
            name=name,
            text_key=key,
            ngram=n,
            document_dir=ddir,
            processes=as_int(d.get("processes", 1), "processes", 1),
            work_dir=(wd.get("output") if isinstance(wd, dict) else wd) or None,
            storage_options=options(d.get("storage_options")),
        )

    @property
    def out_name(self) -> str:
        return self.name

    @property
    def out_attribute(self) -> str:
        return self.name

    def attributes_of(self, doc_path: str) -> str:
        return attribute_path(doc_path, self.name, self.document_dir)

    def document_files(self) -> list[str]:
        return resolve_documents(self.documents, self.storage_options, self.document_dir)
