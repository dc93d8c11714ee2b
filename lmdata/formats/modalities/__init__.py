"""modalities: packed ``.pbin`` token files of the Modalities framework (0.4.0 and later).

Exports :data:`SPEC` (the registry's entry) and the verbs behind it (:func:`detect`,
:func:`open`, :class:`Writer`, :func:`validate`, :func:`info`), plus :func:`merge` for
``lmdata merge`` and the origin's dataset views in :mod:`lmdata.formats.modalities.views`.
The raw JSONL + ``.idx`` side is the format ``modalities-jsonl``
(:mod:`lmdata.formats.modalities_jsonl`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lmdata._lazy import lazy_exports
from lmdata._progress import OnProgress, Ticker
from lmdata.errors import LmdataError, StorageError
from lmdata.formats._spec import (
    FormatSpec,
    TokenSink,
    TokenTarget,
    detector,
    lazy,
)
from lmdata.formats.modalities.layout import HEADER_SIZE, width_for_vocab

if TYPE_CHECKING:
    from lmdata.formats.modalities.reader import PackedTokens

SUFFIX = ".pbin"

# the reader, writer, checks and merge load on first use
__getattr__ = lazy_exports(
    __name__,
    {
        "EOD_POLICY": "lmdata.formats.modalities.writer",
        "eod_policy": "lmdata.formats.modalities.writer",
        "Writer": "lmdata.formats.modalities.writer",
        "PackedTokens": "lmdata.formats.modalities.reader",
        "read_header": "lmdata.formats.modalities.reader",
    },
)
validate = lazy("lmdata.formats.modalities.validate:validate")
merge = lazy("lmdata.formats.modalities.merge:merge")

__all__ = [
    "EOD_POLICY",
    "HEADER_SIZE",
    "SPEC",
    "PackedTokens",
    "Writer",
    "detect",
    "eod_policy",
    "info",
    "merge",
    "open",
    "read_header",
    "validate",
    "width_for_vocab",
]


def detect(path: str | os.PathLike[str]) -> bool:
    """A ``.pbin`` file (even a damaged one, so that opening it says what is wrong), or any
    file whose header matches its size and whose tail is a pickle."""
    from lmdata.formats.modalities.layout import sniff
    from lmdata.storage import resolve

    try:
        store, key = resolve(path)
        if not store.exists(key) or store.is_dir(key):
            return False
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except (OSError, LmdataError):
        return False
    return key.endswith(SUFFIX) or sniff(path)


# open(path, *, allow_unsafe_pickle, repair_origin_merge, storage_options): a .pbin's reader
open = lazy("lmdata.formats.modalities.reader:PackedTokens")


def info(
    path: str | os.PathLike[str],
    *,
    scan: bool = True,
    progress: OnProgress | None = None,
    allow_unsafe_pickle: bool = False,
    repair_origin_merge: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Counts, widths and sizes of a ``.pbin``; ``scan=False`` leaves out the reader's summary
    (its largest id reads every token; ``progress`` counts the token bytes read)."""
    from lmdata import _provenance
    from lmdata.formats.modalities.reader import PackedTokens
    from lmdata.storage import disk_usage

    with PackedTokens(
        path,
        allow_unsafe_pickle=allow_unsafe_pickle,
        repair_origin_merge=repair_origin_merge,
        storage_options=storage_options,
    ) as r:
        out: dict[str, Any] = {"format": "modalities", "path": str(r.path)}
        if scan:
            r.find_max_token_id(progress)
            out.update(r.info())
        else:
            Ticker(progress, r.header.data_len, "info").finish()
        url = r.data.store.url(r.data.key)
        out["apparent_bytes"] = r.data.store.size(r.data.key)
        prov = _provenance.read_sidecar(r.data.store, r.data.key)
    out["bytes_on_disk"] = disk_usage(url)
    if prov is not None:
        out["provenance"] = prov
    return out


def _token_sink(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    options: dict[str, Any] | None = None,
) -> TokenSink:
    # documents arrive with their EOD already appended (the pipeline applies the convention);
    # the writer takes them as one flat array (Writer.write_many)
    from lmdata.formats.modalities.writer import Writer

    return Writer(
        path,
        overwrite=overwrite,
        vocab_size=vocab_size,
        eod_id=eod_id,
        append_eod=False,
        **dict(options or {}),
    )


def _sidecar(store: Any, key: str) -> dict[str, Any] | None:
    from lmdata import _provenance

    return _provenance.read_sidecar(store, key)


SPEC = FormatSpec(
    name="modalities",
    kind="tokens",
    summary="packed .pbin token files (Modalities)",
    detect=detector(detect, "modalities"),
    open=open,
    writer=lazy("lmdata.formats.modalities.writer:Writer"),
    validate=validate,
    info=info,
    aliases=("pbin",),
    merge=merge,
    # the origin's packer appends EOD after every document and lets the tokenizer add its
    # special tokens (the HF default)
    tokens=TokenTarget(open=_token_sink, append_eod=True, special_tokens=True),
    provenance=lambda reader: _sidecar(reader.data.store, reader.data.key),
)
