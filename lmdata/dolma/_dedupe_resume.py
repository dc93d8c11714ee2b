"""Resuming a dedupe job (``resume=True``, ``lmdata dedupe --resume``); see
:mod:`lmdata.dolma.dedupe`.

A resumable job works in a folder of its own that every run of it finds again:
``.lmdata-tmp-dedupe-<digest>`` (in ``work_dir``, the temp folder or beside the attributes, as
any run's), the digest naming the job's place (the attributes name and the datasets written
into). Its ``manifest.json`` holds what the output depends on: each input's path, size and
(locally) modification time, the options, lmdata's version, and the plan (range size, number of
groups and of hash buckets), which a resumed run keeps whatever its worker count, so its units
are the interrupted run's. Every unit of every phase writes, after its outputs are whole, a
marker ``done/NAME`` holding its small result:

- ``h-<group>``: the hash unit's counts and spill tables (where each bucket starts);
- ``m-<bucket>[-<part>]``: the mark unit's count and where each span's marks are;
- ``w-<span>``: a document file's attribute file is written; ``p-<span>-<crc>-<bytes>``: a
  range's piece is (in the job's pieces folder, :func:`lmdata.dolma.pieces.parts_folder`);
- ``j-<span>``: a file written in ranges is joined (named by its last range);
- ``keys``: the key file (``bloom_filter.file``) is written: the job is done. With a key file
  the folder also holds ``prior-parts``, the mark parts of each bucket as the first run chose
  them, so a run resumed after the file was rewritten keeps its units.

A resumed run lists the markers once and runs only the units without one, taking the others'
results from their markers, so the output is the bytes of an uninterrupted run. A resume whose
inputs or options differ is refused (InvalidInputError, as tokenize's ``--resume``); a run
without resume discards the folder (and the pieces folders its manifest names) and starts afresh.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from lmdata._redact import redact_record
from lmdata._version import __version__
from lmdata.dolma._buckets import MarkResult, Spill, marked, spill_root
from lmdata.dolma._spans import Span
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.pieces import Join, job_id, part_key, parts_folder, version
from lmdata.errors import InvalidInputError
from lmdata.formats.dolma._output import join_parts
from lmdata.parallel.staging import json_changes
from lmdata.storage import Store, basename, resolve, scheme

MANIFEST = "manifest.json"
# options that change no output byte (and storage options, which may hold secrets)
_NOT_OPTIONS = frozenset({"documents", "processes", "work_dir", "storage_options"})


@dataclass(frozen=True)
class Plan:
    """How a job's input is cut into units, from which every phase's units follow: the range
    size, the number of hash (and write) groups, the number of hash buckets."""

    range_bytes: int
    groups: int
    nbuckets: int


@dataclass
class Done:
    """What earlier runs of a job finished, from its markers (empty for a fresh job)."""

    hashed: dict[int, tuple[dict[str, Any], np.ndarray]] = field(default_factory=dict)
    marked: dict[str, MarkResult] = field(default_factory=dict)  # by marks object, "d/..."
    written: set[int] = field(default_factory=set)  # spans of whole document files
    pieces: dict[int, tuple[int, int]] = field(default_factory=dict)  # a range's (CRC, bytes)
    joined: set[int] = field(default_factory=set)  # a file in ranges, by its last span
    keys_written: bool = False  # the key file (bloom_filter.file) is written: all is done

    @classmethod
    def read(cls, work: Spill) -> Done:
        """The markers of ``work`` (a name this version did not write is not done: redone)."""
        out = cls()
        for name, (meta, arr) in work.markers(("h-", "m-")).items():
            kind, _, rest = name.partition("-")
            try:
                if kind == "h":
                    out.hashed[int(rest)] = (meta, arr)
                elif kind == "m":
                    out.marked["d/" + rest] = marked(meta, arr)
                elif kind == "w":
                    out.written.add(int(rest))
                elif kind == "p":
                    k, crc, n = map(int, rest.split("-"))
                    out.pieces[k] = (crc, n)
                elif kind == "j":
                    out.joined.add(int(rest))
                elif name == "keys":
                    out.keys_written = True
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def hash(self, t: int, nbuckets: int) -> tuple[int, int, tuple[np.ndarray, ...]] | None:
        """Hash unit ``t``'s (documents, keys, spill tables), if it finished."""
        if t not in self.hashed:
            return None
        meta, arr = self.hashed[t]
        n = meta.get("spills")
        if not isinstance(n, int) or len(arr) != n * (nbuckets + 1):
            return None
        return int(meta["documents"]), int(meta["keys"]), tuple(arr.reshape(n, nbuckets + 1))

    def drop_missing(
        self,
        spans: Sequence[Span],
        out: Callable[[str], str],
        job: str,
        opts: dict[str, Any] | None,
    ) -> None:
        """Forget the pieces marked done that are not in their folder (``lmdata clean`` took
        them, say): they are written again (one listing per file with such pieces)."""
        by_file: dict[int, list[int]] = {}
        for k in self.pieces:
            s = spans[k] if k < len(spans) else None
            if s is not None and s.ranged and k - s.part + s.parts - 1 not in self.joined:
                by_file.setdefault(k - s.part, []).append(k)
        for first, ks in by_file.items():
            store, key = resolve(out(spans[first].path), opts)
            there = set(store.list(parts_folder(key, job)))
            for k in ks:
                if basename(part_key(key, spans[k].part, job)) not in there:
                    del self.pieces[k]

    def span(self, k: int, span: Span) -> bool:
        """True if span ``k``'s attribute rows are written (a file, a range's piece, or the
        range's file joined)."""
        if not span.ranged:
            return k in self.written
        return k in self.pieces or k - span.part + span.parts - 1 in self.joined


class Resumable:
    """One dedupe job's resumable state: its folder, found again by every run of the job."""

    def __init__(
        self,
        cfg: DedupeConfig,
        files: Sequence[str],
        sizes: Sequence[int],
        stores: Callable[[str], tuple[Store, str]],
    ) -> None:
        self.cfg = cfg
        where = [stores(f) for f in files]
        urls = [_url(st, k) for st, k in where]
        # by input, so a changed identity names the input new, gone or changed (_differs)
        inputs = {u: [z, version(st, k)] for u, z, (st, k) in zip(urls, sizes, where, strict=True)}
        options = {
            f.name: getattr(cfg, f.name)
            for f in dataclasses.fields(cfg)
            if f.name not in _NOT_OPTIONS
        }
        raw = orjson.dumps(
            {"lmdata": __version__, "inputs": inputs, "options": options},
            option=orjson.OPT_SORT_KEYS,
            default=repr,
        )
        # as the manifest holds it, to compare (secrets in URLs and options masked: the work
        # folder may be seen by others)
        self.identity = redact_record(orjson.loads(raw))
        roots = sorted({_root(cfg.attributes_of(u)) for u in urls})
        place = job_id("dedupe", cfg.out_name, roots)
        self.work = Spill(spill_root(cfg, files[0], place), cfg.storage_options)

    def previous(self) -> dict[str, Any] | None:
        """The manifest an earlier run of the job left, if any (one that is no JSON object is
        none: a kill before the job began)."""
        raw = self.work.get(MANIFEST)
        try:
            got = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError:
            return None
        return got if isinstance(got, dict) else None

    def check(self, old: dict[str, Any]) -> Plan:
        """The plan of the interrupted run ``old`` continued; InvalidInputError if its inputs or
        options differ from this run's."""
        again = (
            "run it again without --resume (which discards the interrupted run's work and "
            "starts afresh)"
        )
        if old.get("identity") != self.identity:
            raise InvalidInputError(
                f"cannot resume this dedupe job: {_differs(old.get('identity'), self.identity)} "
                f"since the interrupted run; {again}",
                path=self.work.root,
            )
        plan, fields = old.get("plan"), [f.name for f in dataclasses.fields(Plan)]
        odd = [] if isinstance(plan, dict) else ["plan"]
        if not odd:  # a field missing, unknown (another lmdata's plan) or not a count
            odd = [f"plan.{k}" for k in sorted(set(fields) ^ set(plan))]
            odd += [f"plan.{k}" for k in fields if k in plan and not _count(plan[k])]
        if odd:
            raise InvalidInputError(
                f"cannot resume this dedupe job: its manifest's {', '.join(odd)} is not a plan "
                f"this lmdata reads (fields {', '.join(fields)}, each a positive integer); "
                f"{again}",
                path=self.work.root,
            )
        return Plan(**plan)

    def job(self, plan: Plan) -> str:
        """The job's digest, which names its pieces folders."""
        return job_id("dedupe", self.identity, dataclasses.asdict(plan))

    def begin(self, plan: Plan, parts: list[str]) -> None:
        """Start the job afresh: its folder, empty but for the manifest (``parts``: the pieces
        folders it will write, for :meth:`discard`)."""
        self.work.remove()
        self.work.make()
        parts = [p if scheme(p) else os.path.abspath(p) for p in parts]  # for any later cwd
        manifest = {"identity": self.identity, "plan": dataclasses.asdict(plan), "parts": parts}
        self.work.put(MANIFEST, orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS))

    def discard(self, old: dict[str, Any]) -> None:
        """Remove what an earlier run of the job left: its folder and pieces folders."""
        parts = old.get("parts")
        for folder in parts if isinstance(parts, list) else []:
            if isinstance(folder, str):
                store, key = resolve(folder, self.cfg.storage_options)
                store.remove(key)
        self.work.remove()


@dataclass(frozen=True)
class JoinTask:
    """Join a file written in ranges, then mark it joined (``j-<last>``) in ``work``."""

    join: Join
    work: Spill
    last: int


def run_join_marked(task: JoinTask) -> int:
    """Join one file's pieces, mark it joined, then remove its pieces folder (a kill before the
    marker joins it again from the same pieces; after it, :func:`forget_joined` removes the
    folder)."""
    j = task.join
    store, key = resolve(j.output, j.storage_options)
    keys = [part_key(key, k, j.job) for k in range(len(j.checksums))]
    join_parts(store, key, j.compression, keys, j.checksums, overwrite=j.overwrite)
    task.work.mark(f"j-{task.last}")
    store.remove(parts_folder(key, j.job))
    return len(keys)


def forget_joined(outputs: Sequence[str], job: str, opts: dict[str, Any] | None) -> None:
    """Remove the pieces folders of ``outputs`` an earlier run joined (if a kill left one)."""
    for o in outputs:
        store, key = resolve(o, opts)
        store.remove(parts_folder(key, job))


def _count(x: Any) -> bool:
    return type(x) is int and x > 0


def _url(store: Store, key: str) -> str:
    """An input as the manifest names it: a local path absolute, a URL as it is."""
    local = store.local_path(key)
    return store.url(os.path.abspath(local) if local is not None else key)


def _root(attributes: str) -> str:
    """The dataset an attribute file is in."""
    return attributes[: attributes.rindex("/attributes/")]


_CHANGED = "changed (its size or modification time)"


def _differs(old: Any, new: dict[str, Any]) -> str:
    """What differs between an interrupted run's identity and this run's, in a few words:
    each input new, gone or changed, each option changed (its dotted path)."""
    if not isinstance(old, dict):
        return "the inputs or options changed"
    if old.get("lmdata") != new["lmdata"]:
        return f"it was started by lmdata {old.get('lmdata')}, this is {new['lmdata']},"
    was, now = old.get("inputs"), new["inputs"]
    inputs, options, other = [], [], []
    for at in json_changes(old, new):
        if at[0] == "inputs" and len(at) == 2 and isinstance(was, dict):
            how = "is new" if at[1] not in was else "is gone" if at[1] not in now else _CHANGED
            inputs.append(f"input {at[1]} {how}")
        elif at[0] == "options" and len(at) > 1:
            options.append(".".join(at[1:]))
        else:
            other.append(".".join(at))
    said = inputs[:3] + ([f"and {len(inputs) - 3} more inputs"] if len(inputs) > 3 else [])
    if options:
        said.append(f"options {', '.join(options)} changed")
    said += [f"the {o or 'identity'} changed" for o in other]
    return ", ".join(said) or "the inputs or options changed"
