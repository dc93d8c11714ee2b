"""The keys a dolma config may hold, at every nesting level, and the one check that rejects
any other key with its path and the closest accepted key.

dolma 1.2.1 merges a config into OmegaConf structured dataclasses, so a misspelled key
(``dedupe.min_lenght``) is an error there, not a default silently used. The sets below are
the fields of those dataclasses (dolma/cli/{deduper,mixer,tagger,shared}.py in 1.2.1),
including the ones lmdata accepts and does not need (``is_s3_volume``, ``work_dir``,
``debug``, ``profile``), plus lmdata's own keys, each marked.

A schema maps each accepted key to ``None`` (a value), a schema (a mapping, checked when the
value is a mapping), or a one-element list holding a schema (a list of such mappings).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Union

from lmdata.errors import InvalidInputError

Schema = Mapping[str, Union["Schema", list["Schema"], None]]

WORK_DIR: Schema = {"input": None, "output": None}
COMPRESSION: Schema = {"input": None, "output": None}

BY_NGRAM: Schema = dict.fromkeys(
    ("ngram_length", "stride", "overlap_threshold", "skip_short_paragraphs")
)
# dolma's Bloom filter sizing keys (sysram_limit: later dolma versions'): accepted, recorded in
# ``Bloom.given``, not used
BLOOM_SIZING_KEYS = (
    "size_in_bytes",
    "estimated_doc_count",
    "desired_false_positive_rate",
    "sysram_limit",
)
BLOOM_FILTER: Schema = dict.fromkeys(("file", "read_only", *BLOOM_SIZING_KEYS, "save_to_disk"))
DEDUPE: Schema = {
    "documents": None,
    "work_dir": WORK_DIR,
    "dedupe": {
        "name": None,
        "documents": {"attribute_name": None, "key": None},
        "paragraphs": {
            "attribute_name": None,
            "by_ngram": BY_NGRAM,
            "paragraph_separator": None,
            "dolma_offsets": None,  # lmdata: dolma's paragraph end offsets or exact ones
        },
        # lmdata: MinHash-LSH near-duplicates (lmdata.dolma.minhash)
        "minhash": dict.fromkeys(
            (
                "attribute_name",
                "ngram_size",
                "num_bands",
                "band_size",
                "jaccard_threshold",
                "seed",
            )
        ),
        "skip_empty": None,
        "min_length": None,
        "min_words": None,
        "num_partitions": None,
        "partition_index": None,
        "file_partition": None,
        "document_dir": None,
    },
    "bloom_filter": BLOOM_FILTER,
    "processes": None,
    "compression": COMPRESSION,
    "dryrun": None,
    "is_s3_volume": None,  # a mounted S3 volume: nothing for lmdata to do
    "storage_options": None,  # lmdata: fsspec options for URLs
}

# lmdata decontaminate's config (lmdata.dolma.decontam): no dolma counterpart
DECONTAM: Schema = {
    "documents": None,
    "against": None,
    "text_key": None,
    "ngram": None,
    "name": None,
    "document_dir": None,
    "processes": None,
    "work_dir": WORK_DIR,
    "dryrun": None,
    "storage_options": None,
}

SPAN_REPLACEMENT: Schema = dict.fromkeys(
    ("span", "min_score", "max_score", "replacement", "syntax")
)
STREAM: Schema = {
    "name": None,
    "documents": None,
    "output": dict.fromkeys(("path", "max_size_in_bytes", "discard_fields", "min_text_length")),
    "attributes": None,
    "filter": dict.fromkeys(("include", "exclude", "syntax")),
    "span_replacement": [SPAN_REPLACEMENT],
    "compression": COMPRESSION,
}
MIX: Schema = {
    "streams": [STREAM],
    "work_dir": WORK_DIR,
    "processes": None,
    "shuffle": None,
    "dryrun": None,
    "storage_options": None,  # lmdata
}

TAG: Schema = {
    "documents": None,
    "destination": None,  # refused with a message: lmdata writes beside documents/
    "tagger_modules": None,
    "taggers": None,
    "experiment": None,
    "processes": None,
    "ignore_existing": None,
    "debug": None,
    "profile": dict.fromkeys(("enable", "output", "steps", "sort_key", "lines")),
    "work_dir": WORK_DIR,
    "dryrun": None,
    "seed": None,  # lmdata: the random_number_v1 seed
    "compression": None,  # lmdata: accepted, the file names say the compression
    "storage_options": None,  # lmdata
}


def _unknown(data: Mapping[Any, Any], schema: Schema, path: str) -> list[str]:
    """Each unknown key under ``path`` (recursively) as ``path.key`` with a suggestion."""
    out: list[str] = []
    for key, value in data.items():
        prefix = f"{path}." if path else ""
        where = f"{prefix}{key}"
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            out.append(where + hint)
            continue
        sub = schema[key]
        if isinstance(sub, list) and isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    out += _unknown(item, sub[0], f"{where}[{i}]")
        elif isinstance(sub, Mapping) and isinstance(value, Mapping):
            out += _unknown(value, sub, where)
    return out


def check_keys(data: Mapping[Any, Any], schema: Schema, what: str) -> None:
    """Raise an InvalidInputError naming every key of ``data`` (at any depth) that ``schema``
    does not accept, with the closest accepted key, as dolma refuses them."""
    if not isinstance(data, Mapping):
        raise InvalidInputError(
            f"{what} must be a mapping of keys to values, got {type(data).__name__}"
        )
    unknown = _unknown(data, schema, "")
    if unknown:
        s = "s" if len(unknown) > 1 else ""
        raise InvalidInputError(
            f"{what}: unknown key{s} {'; '.join(unknown)}: a misspelled key would be ignored, "
            "so fix or remove it (dolma refuses it too)"
        )
