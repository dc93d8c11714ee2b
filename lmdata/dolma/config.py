"""dolma's configs (YAML or JSON, as ``dolma -c``) parsed into frozen dataclasses, checked
in one place, with dotted command-line overrides (``processes=2``, ``dedupe.name=x``).

Relative paths are taken from the current directory, as dolma does. Documents and outputs may
be local paths or URLs (``s3://``, ``memory://``, ...); ``storage_options`` (fsspec options,
from the API or ``--storage-option``) reach every store a job opens, in every worker.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from lmdata.dolma._checks import as_int as _int
from lmdata.dolma._checks import as_list as _as_list
from lmdata.dolma._checks import options as _options
from lmdata.dolma._keys import BLOOM_SIZING_KEYS, DEDUPE, MIX, TAG, check_keys
from lmdata.dolma._minhash_config import MinHash, minhash_section
from lmdata.errors import InvalidInputError
from lmdata.formats.dolma._paths import attribute_path, expand_globs, list_documents
from lmdata.storage import resolve

DEFAULT_MAX_SIZE = 2 * 1024**3  # the dolma CLI's default max_size_in_bytes (2 GiB)


@functools.cache
def _loader() -> Any:
    """A SafeLoader reading YAML as dolma's configs are read (OmegaConf): ``1e-9`` is a number,
    not a string (PyYAML's YAML 1.1 resolver wants a dot in a float). Built on first use, so
    that workers, which get their configs ready-made, never import yaml."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
        list("-+0123456789."),
    )
    return Loader


def load_yaml(text: str) -> Any:
    """YAML text (a config file, a ``--set`` value) with dolma's number rules."""
    import yaml

    return yaml.load(text, Loader=_loader())  # a SafeLoader: no arbitrary objects


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML or JSON config file as a dict (YAML is a superset, so one loader reads both)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidInputError(f"cannot read config {p}: {e.strerror}") from None
    import yaml

    try:
        data = orjson.loads(text) if p.suffix == ".json" else load_yaml(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as e:
        raise InvalidInputError(f"config {p} is not valid YAML/JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"config {p}: the top level must be a mapping")
    return data


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with ``{"a.b": v}`` set at ``data["a"]["b"]`` (None values skipped);
    a number indexes a list (``streams.0.output.path``). A key through a list by a name, or
    past its end, is an InvalidInputError (it replaced the whole list with a mapping)."""
    out = orjson.loads(orjson.dumps(data))
    for key, value in overrides.items():
        if value is None or value == ():
            continue
        node: Any = out
        parts = key.split(".")
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    raise InvalidInputError(
                        f"--set {key}: {'.'.join(parts[:i]) or 'the config'} is a list of "
                        f"{len(node)}; name an item by its index (0 to {len(node) - 1})"
                    )
                idx: Any = int(p)
            else:
                idx = p
                if not last and not isinstance(node.get(p), (dict, list)):
                    node[p] = {}
            if last:
                node[idx] = list(value) if isinstance(value, tuple) else value
            else:
                node = node[idx]
    return out


def resolve_documents(
    patterns: tuple[str, ...],
    storage_options: dict[str, Any] | None = None,
    documents: str = "documents",
) -> list[str]:
    """Document files (local paths or URLs) from globs, single files, or tree folders (all of
    their documents; the ``documents`` folder may have another name, dedupe's
    ``document_dir``)."""
    out: list[str] = []
    seen: set[str] = set()
    for pat in patterns:
        store, key = resolve(pat, storage_options)
        if store.is_dir(key):
            found = [store.url(k) for k in list_documents(store, key, documents)]
        else:
            found = expand_globs([pat], storage_options=storage_options)
        for f in found:
            if f not in seen:
                seen.add(f)
                out.append(f)
    if not out:
        raise InvalidInputError(f"no document files match {list(patterns)}")
    return out


@dataclass(frozen=True)
class Ngrams:
    """The ``by_ngram`` settings of paragraph dedupe (dolma's defaults; ``length`` 0 means
    exact paragraphs); :mod:`lmdata.dolma.ngrams` computes the keys."""

    length: int = 0
    stride: int = 0
    threshold: float = 1.0
    skip_short: bool = False


@dataclass(frozen=True)
class TagConfig:
    documents: tuple[str, ...]
    taggers: tuple[str, ...]
    experiment: str | None = None
    tagger_modules: tuple[str, ...] = ()
    processes: int = 1
    seed: int = 0
    ignore_existing: bool = False
    compression: str = (
        "gz"  # accepted; an attribute file is written as its name says (.gz, .zst, plain)
    )
    storage_options: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TagConfig:
        check_keys(d, TAG, "tag config")
        docs = _as_list(d.get("documents"), "documents")
        if not docs:
            raise InvalidInputError(
                "tag config: `documents` (globs or a dataset folder) is required"
            )
        if d.get("destination"):
            raise InvalidInputError(
                "tag config: `destination` is not supported; lmdata writes attributes/"
                "<experiment>/ beside each documents/ folder, as dolma does without it"
            )
        return cls(
            documents=docs,
            taggers=_as_list(d.get("taggers"), "taggers"),
            experiment=d.get("experiment") or None,
            tagger_modules=_as_list(d.get("tagger_modules"), "tagger_modules"),
            processes=_int(d.get("processes", 1), "processes", 1),
            seed=_int(d.get("seed", 0), "seed"),
            ignore_existing=bool(d.get("ignore_existing", False)),
            compression=d.get("compression") or "gz",
            storage_options=_options(d.get("storage_options")),
        )

    def document_files(self) -> list[str]:
        return resolve_documents(self.documents, self.storage_options)


def _by_ngram(v: Any) -> Ngrams:
    """``dedupe.paragraphs.by_ngram`` with dolma's defaults (absent or ``ngram_length`` 0:
    exact paragraphs, as in dolma)."""
    if v is None:
        return Ngrams()
    if not isinstance(v, dict):
        raise InvalidInputError(f"dedupe.paragraphs.by_ngram must be a mapping, got {v!r}")
    where = "dedupe.paragraphs.by_ngram"
    thr = v.get("overlap_threshold", 1.0)
    if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0 <= thr <= 1:
        raise InvalidInputError(f"{where}.overlap_threshold must be a number in 0..1, got {thr!r}")
    return Ngrams(
        length=_int(v.get("ngram_length", 0), f"{where}.ngram_length"),
        stride=_int(v.get("stride", 0), f"{where}.stride"),
        threshold=float(thr),
        skip_short=bool(v.get("skip_short_paragraphs", False)),
    )


@dataclass(frozen=True)
class Bloom:
    """``bloom_filter``: lmdata keeps exact keys, not a Bloom filter. ``file`` is a key file
    in lmdata's format (:mod:`lmdata.dolma._keyfile`): read first if it exists, marking every
    key in it as seen, and rewritten with this run's keys added, unless ``read_only``, where
    it must exist and only marks (dolma's decontamination recipe). ``given``: the sizing keys
    given, accepted and not used (exact: no false positives)."""

    file: str | None = None
    read_only: bool = False
    save: bool = True  # save_to_disk: write the key file (unless read_only)
    given: tuple[str, ...] = ()

    @property
    def writes(self) -> bool:
        """Whether the run writes the key file (``file`` given, saved, not read only)."""
        return bool(self.file) and self.save and not self.read_only


def _bloom(v: Any) -> Bloom:
    """The ``bloom_filter`` section, checked."""
    if v is None:
        return Bloom()
    if not isinstance(v, dict):
        raise InvalidInputError(f"bloom_filter must be a mapping, got {v!r}")
    for k in ("size_in_bytes", "estimated_doc_count"):
        if v.get(k) is not None:
            _int(v[k], f"bloom_filter.{k}")
    rate = v.get("desired_false_positive_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))):
        raise InvalidInputError(
            f"bloom_filter.desired_false_positive_rate must be a number, got {rate!r}"
        )
    file = v.get("file")
    if file is not None and (not isinstance(file, str) or not file):
        raise InvalidInputError(f"bloom_filter.file must be a path or URL, got {file!r}")
    read_only, save = v.get("read_only", False), v.get("save_to_disk", True)
    for k, flag in (("read_only", read_only), ("save_to_disk", save)):
        if not isinstance(flag, bool):
            raise InvalidInputError(f"bloom_filter.{k} must be true or false, got {flag!r}")
    limit = v.get("sysram_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
        raise InvalidInputError(f"bloom_filter.sysram_limit must be a number, got {limit!r}")
    if read_only and not file:
        raise InvalidInputError(
            "bloom_filter.read_only needs bloom_filter.file: the key file to check against "
            "(write it with a dedupe run whose read_only is false)"
        )
    sizing = tuple(k for k in BLOOM_SIZING_KEYS if v.get(k) not in (None, False, 0))
    return Bloom(file or None, read_only, save, sizing)


def _partitions(dd: dict[str, Any]) -> tuple[int, int, bool]:
    """``(num_partitions, partition_index, file_partition)``, checked."""
    parts = _int(
        1 if dd.get("num_partitions") is None else dd["num_partitions"], "dedupe.num_partitions", 1
    )
    index = _int(
        0 if dd.get("partition_index") is None else dd["partition_index"],
        "dedupe.partition_index",
    )
    if index >= parts:
        raise InvalidInputError(
            f"dedupe.partition_index {index} is not below dedupe.num_partitions {parts}; "
            f"run the partitions 0..{parts - 1}"
        )
    fp = dd.get("file_partition", False)
    if not isinstance(fp, bool):
        raise InvalidInputError(f"dedupe.file_partition must be true or false, got {fp!r}")
    return parts, index, fp


def _document_dir(v: Any) -> str:
    if v is None:
        return "documents"
    if not isinstance(v, str) or not v or "/" in v:
        raise InvalidInputError(
            f"dedupe.document_dir must be one path component (default documents), got {v!r}"
        )
    return v


@dataclass(frozen=True)
class DedupeConfig:
    documents: tuple[str, ...]
    name: str
    mode: str  # "documents" | "paragraphs" | "minhash"
    attribute_name: str
    key: str = "$.text"  # documents mode: the JSONPath of the string key
    paragraph_separator: str = "\n"
    skip_empty: bool = False  # dolma's default: empty paragraphs and keys are hashed too
    min_length: int = 0  # paragraphs: characters; documents: bytes of the key
    min_words: int = 0
    processes: int = 1
    work_dir: str | None = None
    compression: str = (
        "gz"  # accepted; an attribute file is written as its name says (.gz, .zst, plain)
    )
    dolma_offsets: bool = True  # reproduce dolma's paragraph end offsets (see dedupe.py)
    ngrams: Ngrams = field(default_factory=Ngrams)  # by_ngram (length 0: exact paragraphs)
    bloom_filter: Bloom = field(default_factory=Bloom)  # a key file; the sizing keys unused
    document_dir: str = "documents"  # the path component replaced by attributes/<name>
    num_partitions: int = 1  # keys split by hash: this run considers partition_index's
    partition_index: int = 0
    file_partition: bool = False  # ... and the files split by path: this run takes its part
    minhash: MinHash | None = None  # mode "minhash": its settings (lmdata.dolma.minhash)
    storage_options: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DedupeConfig:
        check_keys(d, DEDUPE, "dedupe config")
        dd = d.get("dedupe")
        if not isinstance(dd, dict):
            raise InvalidInputError("dedupe config: a `dedupe:` section is required")
        docs = _as_list(d.get("documents"), "documents")
        if not docs:
            raise InvalidInputError("dedupe config: `documents` is required")
        dmode, pmode, mmode = dd.get("documents"), dd.get("paragraphs"), dd.get("minhash")
        if bool(dmode) + bool(pmode) + bool(mmode) != 1:
            raise InvalidInputError(
                "dedupe config: give exactly one of `dedupe.documents` "
                "(with attribute_name and key), `dedupe.paragraphs` or `dedupe.minhash`"
            )
        sect = dmode or pmode or mmode
        if not isinstance(sect, dict) or not sect.get("attribute_name"):
            raise InvalidInputError("dedupe config: the mode needs an `attribute_name`")
        name = dd.get("name") or sect["attribute_name"]  # dolma's fallback
        if not isinstance(name, str):
            raise InvalidInputError(
                "dedupe config: `dedupe.name` (the attributes folder) must be a string"
            )
        key = "$.text"
        if dmode:
            key = sect.get("key")
            if not isinstance(key, str) or not key:
                raise InvalidInputError(
                    "dedupe config: `dedupe.documents.key` is required, a "
                    "JSONPath such as $.metadata.url or $.text"
                )
            if not key.startswith("$"):
                raise InvalidInputError(
                    f"dedupe.documents.key {key!r} is not a JSONPath; did you mean '$.{key}'?"
                )
        ngrams = _by_ngram(sect.get("by_ngram")) if pmode else Ngrams()
        parts, index, by_file = _partitions(dd)
        minhash = minhash_section(sect) if mmode else None
        if minhash is not None and (parts > 1 or by_file or d.get("bloom_filter")):
            raise InvalidInputError(
                "dedupe config: dedupe.minhash takes no num_partitions, file_partition or "
                "bloom_filter (it compares every document with every other, exactly)"
            )
        wd = d.get("work_dir")
        return cls(
            documents=docs,
            name=name,
            mode="documents" if dmode else "paragraphs" if pmode else "minhash",
            attribute_name=str(sect["attribute_name"]),
            key=key,
            paragraph_separator=str(sect.get("paragraph_separator", "\n")) or "\n",
            skip_empty=bool(dd.get("skip_empty", False)),  # dolma's default
            min_length=_int(dd.get("min_length", 0) or 0, "dedupe.min_length"),
            min_words=_int(dd.get("min_words", 0) or 0, "dedupe.min_words"),
            dolma_offsets=bool(sect.get("dolma_offsets", True)),
            ngrams=ngrams,
            bloom_filter=_bloom(d.get("bloom_filter")),
            document_dir=_document_dir(dd.get("document_dir")),
            num_partitions=parts,
            partition_index=index,
            file_partition=by_file,
            minhash=minhash,
            processes=_int(d.get("processes", 1), "processes", 1),
            work_dir=(wd.get("output") if isinstance(wd, dict) else wd) or None,
            compression=(d.get("compression") or {}).get("output") or "gz"
            if isinstance(d.get("compression"), dict)
            else "gz",
            storage_options=_options(d.get("storage_options")),
        )

    @property
    def key_partitions(self) -> int:
        """Into how many partitions the keys are split (1: all keys are this run's). dolma
        1.2.1 splits them with ``file_partition`` too (checked by running it)."""
        return self.num_partitions

    @property
    def suffix(self) -> str:
        """What dolma appends to the attributes folder and key of a key partition: ``_<i>``."""
        return f"_{self.partition_index}" if self.key_partitions > 1 else ""

    @property
    def out_name(self) -> str:
        """The attributes folder written: ``name``, ``_<i>`` added for a key partition."""
        return self.name + self.suffix

    @property
    def out_attribute(self) -> str:
        """The attribute key written: ``attribute_name``, ``_<i>`` added for a key partition."""
        return self.attribute_name + self.suffix

    def attributes_of(self, doc_path: str) -> str:
        """The attribute file this run writes for document file ``doc_path``."""
        return attribute_path(doc_path, self.out_name, self.document_dir)

    def document_files(self) -> list[str]:
        """The document files this run dedupes: all, or with ``file_partition`` those whose
        path (from the ``document_dir`` component on) hashes to ``partition_index`` (dolma
        hashes the whole path with Rust's DefaultHasher: another split of the files)."""
        files = resolve_documents(self.documents, self.storage_options, self.document_dir)
        if not self.file_partition or self.num_partitions == 1:
            return files
        return [f for f in files if file_partition(f, self) == self.partition_index]


def file_partition(path: str, cfg: DedupeConfig) -> int:
    """The file partition of document file ``path``: xxh3-64 of its path from the
    ``document_dir`` component on (so the same for a local copy and one on a store), modulo
    ``num_partitions``."""
    import xxhash

    rel = path.replace("\\", "/")
    cut = rel.rfind(f"/{cfg.document_dir}/")
    rel = rel[cut + 1 :] if cut >= 0 else rel.rpartition("/")[2]
    return xxhash.xxh3_64_intdigest(rel.encode("utf-8", "surrogatepass")) % cfg.num_partitions


@dataclass(frozen=True)
class SpanReplacement:
    span: str
    replacement: str
    min_score: float | None = None
    max_score: float | None = None
    syntax: str = "jsonpath"


@dataclass(frozen=True)
class StreamConfig:
    name: str
    documents: tuple[str, ...]
    attributes: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    syntax: str = "jsonpath"
    span_replacement: tuple[SpanReplacement, ...] = ()
    output_path: str = "."
    max_size_in_bytes: int = DEFAULT_MAX_SIZE
    discard_fields: tuple[str, ...] = ()
    min_text_length: int = 0
    compression_output: str | None = None  # None: infer (gz)
    shuffle: bool = True
    storage_options: dict[str, Any] | None = field(default=None, compare=False, repr=False)


def _span_replacement(d: Any, where: str) -> SpanReplacement:
    if not isinstance(d, dict) or not isinstance(d.get("span"), str):
        raise InvalidInputError(f"{where}: each span_replacement needs a `span` selector")
    if d.get("min_score") is None and d.get("max_score") is None:
        raise InvalidInputError(f"{where}: span_replacement needs min_score and/or max_score")
    rep = d.get("replacement", "")
    if not isinstance(rep, str):
        raise InvalidInputError(f"{where}: replacement must be a string")
    return SpanReplacement(
        span=d["span"],
        replacement=rep,
        min_score=d.get("min_score"),
        max_score=d.get("max_score"),
        syntax=d.get("syntax", "jsonpath"),
    )


def _stream(
    d: Any, i: int, shuffle: bool, storage_options: dict[str, Any] | None = None
) -> StreamConfig:
    where = f"streams[{i}]"
    if not isinstance(d, dict):
        raise InvalidInputError(f"{where} must be a mapping")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"{where}: `name` (the output file prefix) is required")
    docs = _as_list(d.get("documents"), f"{where}.documents")
    if not docs:
        raise InvalidInputError(f"{where}: `documents` is required")
    filt = d.get("filter")
    reps = d.get("span_replacement") or []
    if filt is None and not reps:
        raise InvalidInputError(
            f"{where}: give a `filter` or a `span_replacement` (dolma requires one)"
        )
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    syntax = "jsonpath"
    if filt is not None:
        if not isinstance(filt, dict):
            raise InvalidInputError(f"{where}.filter must be a mapping")
        include = _as_list(filt.get("include"), f"{where}.filter.include")
        exclude = _as_list(filt.get("exclude"), f"{where}.filter.exclude")
        syntax = filt.get("syntax") or "jsonpath"
        if not include and not exclude:
            raise InvalidInputError(f"{where}.filter is empty; give include and/or exclude")
    out = d.get("output")
    if not isinstance(out, dict) or not out.get("path"):
        raise InvalidInputError(f"{where}: `output.path` is required")
    comp = d.get("compression") or {}
    return StreamConfig(
        name=name,
        documents=docs,
        attributes=_as_list(d.get("attributes"), f"{where}.attributes"),
        include=include,
        exclude=exclude,
        syntax=syntax,
        span_replacement=tuple(_span_replacement(r, where) for r in reps),
        output_path=str(out["path"]),
        max_size_in_bytes=_int(
            out.get("max_size_in_bytes", DEFAULT_MAX_SIZE), f"{where}.output.max_size_in_bytes", 1
        ),
        discard_fields=_as_list(out.get("discard_fields"), f"{where}.output.discard_fields"),
        min_text_length=_int(out.get("min_text_length", 0) or 0, f"{where}.output.min_text_length"),
        compression_output=comp.get("output") if isinstance(comp, dict) else None,
        shuffle=shuffle,
        storage_options=storage_options,
    )


@dataclass(frozen=True)
class MixerConfig:
    streams: tuple[StreamConfig, ...]
    processes: int = 1
    work_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MixerConfig:
        check_keys(d, MIX, "mix config")
        streams = d.get("streams")
        if not isinstance(streams, list) or not streams:
            raise InvalidInputError("mix config: `streams` (a list) is required")
        shuffle = d.get("shuffle", True)
        wd = d.get("work_dir")
        opts = _options(d.get("storage_options"))
        return cls(
            streams=tuple(_stream(s, i, bool(shuffle), opts) for i, s in enumerate(streams)),
            processes=_int(d.get("processes", 1), "processes", 1),
            work_dir=(wd.get("output") if isinstance(wd, dict) else wd) or None,
        )
