"""``tag``: run taggers over document files and write row-aligned attribute files.

With an experiment name every tagger's keys go to ``attributes/<experiment>/`` (keys
``<experiment>__<tagger>__<type>``); without one each tagger writes ``attributes/<tagger>/``
with keys ``<tagger>__<tagger>__<type>``, as dolma does. One task per document file; each output
file appears atomically, and an existing one is kept (resume) unless ``ignore_existing``.
Documents and attributes live in any store (local paths, ``s3://``, ``memory://``, ...).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from lmdata import parallel
from lmdata.dolma.config import TagConfig
from lmdata.dolma.taggers import load_modules, make_tagger, tag_document
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats.dolma._files import iter_raw_lines
from lmdata.formats.dolma._output import OutputFile
from lmdata.formats.dolma._paths import attribute_path, is_file
from lmdata.formats.dolma._rows import parse_line
from lmdata.storage import resolve


@dataclass(frozen=True)
class TagResult:
    files: int
    skipped_files: int
    documents: int
    seconds: float
    outputs: tuple[str, ...]

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


def _outputs(doc_file: str, cfg: TagConfig) -> list[tuple[str, str, list[str]]]:
    """(attribute file, experiment, tagger names) written for one document file."""
    if cfg.experiment:
        return [(attribute_path(doc_file, cfg.experiment), cfg.experiment, list(cfg.taggers))]
    return [(attribute_path(doc_file, t), t, [t]) for t in cfg.taggers]


@dataclass(frozen=True)
class TagTask:
    """Tag the documents of one file (the worker reads it)."""

    path: str
    cfg: TagConfig


@dataclass(frozen=True)
class TagFileResult:
    documents: int
    skipped: bool  # every output existed already


def _tag_file(task: TagTask) -> TagFileResult:
    cfg = task.cfg
    store, path = resolve(task.path, cfg.storage_options)
    where = store.url(path)
    outs = _outputs(path, cfg)
    if not cfg.ignore_existing and all(is_file(store, o) for o, _, _ in outs):
        return TagFileResult(0, True)
    load_modules(cfg.tagger_modules)
    groups = [[(exp, n, make_tagger(n, seed=cfg.seed)) for n in names] for _, exp, names in outs]
    n = 0
    files: list[OutputFile] = []
    try:
        for o, _, _ in outs:
            files.append(OutputFile(store, o, cfg.compression))
        for lineno, raw in iter_raw_lines(store, path):
            doc = parse_line(raw, where, lineno)
            if not isinstance(doc.get("text"), str):
                raise CorruptDataError(
                    "document has no string 'text' to tag; run `lmdata validate` on the tree",
                    path=where,
                    position=f"line {lineno}",
                )
            if "id" not in doc:
                raise CorruptDataError(
                    "document has no 'id'; attribute rows are matched by id",
                    path=where,
                    position=f"line {lineno}",
                )
            source = doc.get("source")
            for f, group in zip(files, groups, strict=True):
                row = {
                    "id": doc["id"],
                    "attributes": tag_document(doc, group),
                    "source": source if isinstance(source, str) else "",
                }
                f.write(orjson.dumps(row) + b"\n")
            n += 1
            if n % parallel.REPORT_EVERY == 0:
                parallel.report(parallel.REPORT_EVERY)
    except BaseException:
        for f in files:
            f.abort()
        raise
    for f in files:  # all of a file's outputs appear together, after every one is written
        f.commit()
    parallel.report(n % parallel.REPORT_EVERY)
    return TagFileResult(n, False)


def tag(
    cfg: TagConfig,
    progress: bool = False,
    engine: str = "processes",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> TagResult:
    """Run ``cfg.taggers`` over ``cfg.documents`` on ``cfg.processes`` workers of ``engine``
    ("inprocess", "processes", "ray" at ``address``); see the module docstring for outputs.
    ``storage_options`` (fsspec options for URLs) replace the config's."""
    if storage_options is not None:
        cfg = dataclasses.replace(cfg, storage_options=dict(storage_options))
    if not cfg.taggers:
        raise InvalidInputError("no taggers given; name at least one (see `lmdata tag --list`)")
    load_modules(cfg.tagger_modules)
    for name in cfg.taggers:
        make_tagger(name, seed=cfg.seed)  # fail early on unknown names
    files = cfg.document_files()
    t0 = time.perf_counter()
    results = parallel.run_all(
        _tag_file,
        [TagTask(f, cfg) for f in files],
        engine=engine,
        workers=cfg.processes,
        address=address,
        desc="tag",
        progress=progress,
    )
    outs = tuple(o for f in files for o, _, _ in _outputs(f, cfg))
    return TagResult(
        files=len(files),
        skipped_files=sum(r.skipped for r in results),
        documents=sum(r.documents for r in results),
        seconds=time.perf_counter() - t0,
        outputs=outs,
    )


def tag_paths(documents: Sequence[str] | str, taggers: Sequence[str], **options: Any) -> TagResult:
    """Convenience wrapper: ``tag_paths("ds/documents/*.gz", ["char_length_v1"], ...)``."""
    docs = [documents] if isinstance(documents, str) else list(documents)
    return tag(TagConfig.from_dict({"documents": docs, "taggers": list(taggers), **options}))
