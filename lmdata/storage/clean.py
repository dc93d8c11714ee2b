"""Finding and removing what killed writers left: staged outputs and claims on new URLs.

A writer that dies leaves at most two kinds of objects, both named so they can be found:
``.lmdata-tmp-NAME-<id>`` (an output staged beside its destination: a local temporary
directory or file, or the new objects of a replacing write on an object store) and
``.lmdata-writing`` claims (a write to a new URL on an object store, whose objects sit under
their final names). A claim whose write reached its commit lists the objects the commit writes:
if they are all there, the dataset is whole and only the claim is left over; otherwise the
claimed directory (or object) held nothing but the dead writer's objects and goes with it.
Only leftovers untouched for ``older_than`` seconds count, so a running writer keeps its own.
A third kind is kept unless asked for: the staging folder (``.NAME.lmdata-work``,
``.NAME.lmdata-convert``) an interrupted tokenize or convert keeps for ``--resume``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lmdata.errors import InvalidInputError
from lmdata.storage.base import Store, basename, join, parent
from lmdata.storage.paths import CLAIM, TMP_PREFIX, is_work_name, require_exists

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Leftover:
    """One thing a failed write left: ``kind`` is ``staged`` (a ``.lmdata-tmp-`` output),
    ``unfinished`` (a claimed write that never committed: its objects and claim), ``claim``
    (the claim of a write that committed) or ``resumable`` (an interrupted tokenize's or
    convert's staging, which ``--resume`` continues); ``remove`` lists the keys that go (none
    for a resumable folder kept)."""

    kind: str
    url: str
    bytes: int
    age: float  # seconds since anything below it last changed
    remove: tuple[str, ...]


def parse_age(text: str) -> float:
    """``90``, ``30s``, ``15m``, ``2h``, ``1d`` as seconds."""
    t = text.strip().lower()
    scale = UNITS.get(t[-1:], None)
    try:
        value = float(t[:-1] if scale else t)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not an age such as 90, 30s, 15m, 2h or 1d") from None
    if not value >= 0:  # negative, or nan (which no age is younger than)
        raise InvalidInputError(f"age {text!r} is not a number of seconds >= 0")
    return value * (scale or 1)


def _mtime(info: dict[str, Any]) -> float | None:
    import datetime as _dt  # here: every first open imports lmdata.storage, few ever clean

    for k in ("LastModified", "mtime", "updated", "last_modified", "created"):
        v = info.get(k)
        if isinstance(v, _dt.datetime):
            return v.timestamp()
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                return _dt.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _objects(store: Store, key: str) -> Iterator[tuple[str, int, float | None]]:
    """(key, bytes, modification time) of every object below ``key``: one recursive listing
    on object stores, a walk on local disk."""
    fs = getattr(store, "fs", None)
    if fs is None:
        for root, dirs, files in os.walk(key):
            for d in dirs:  # a staged directory killed before its first file is empty
                if _topmost(d):
                    p = os.path.join(root, d)
                    try:
                        mtime = os.stat(p).st_mtime
                    except OSError:  # committed (renamed into place) since the listing
                        continue
                    yield p, 0, mtime
            for f in files:
                p = os.path.join(root, f)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                yield p, st.st_size, st.st_mtime
        return
    for k, info in fs.find(key, detail=True, withdirs=False).items():
        yield k, int(info.get("size") or 0), _mtime(info)


def _topmost(name: str) -> bool:
    """Whether ``name`` is a leftover folder taken whole: a staged output or a resumable
    job's staging."""
    return name.startswith(TMP_PREFIX) or is_work_name(name)


def _group(store: Store, key: str) -> dict[str, list[tuple[str, int, float | None]]]:
    """Objects below ``key`` by the leftover they belong to: a ``.lmdata-tmp-`` path or a
    resumable job's staging folder (the topmost), or a claim (its key)."""
    local = getattr(store, "fs", None) is None
    base = os.path.normpath(key) if local else key.rstrip("/")
    out: dict[str, list[tuple[str, int, float | None]]] = {}
    for k, size, mtime in _objects(store, key):
        rel = os.path.relpath(k, base) if local else k[len(base) :].lstrip("/")
        parts = rel.replace(os.sep, "/").split("/") if rel not in ("", ".") else []
        for i, part in enumerate(parts):
            if _topmost(part):
                out.setdefault(join(base, *parts[: i + 1]), []).append((k, size, mtime))
                break
        else:
            if parts and (parts[-1] == CLAIM or parts[-1].startswith(CLAIM + "-")):
                out.setdefault(k, []).append((k, size, mtime))
    if _topmost(basename(base)):  # the URL given is itself a leftover
        out = {base: [o for objs in out.values() for o in objs]} if out else out
    return out


def _claim_target(claim: str) -> str:
    """What a claim guards: its directory, or the object named after ``.lmdata-writing-``."""
    name = basename(claim)
    return parent(claim) if name == CLAIM else join(parent(claim), name[len(CLAIM) + 1 :])


def _committed(store: Store, claim: str, target: str) -> bool:
    """Whether the claimed write reached its commit and every object it lists is there."""
    from lmdata import _json

    try:
        info = _json.from_bytes(store.read(claim, 1 << 20), path=store.url(claim), what="claim")
    except Exception:  # unreadable: the write cannot be shown to have finished
        return False
    names = info.get("committing")
    if not isinstance(names, list) or not store.exists(target):
        return False
    return all(isinstance(n, str) and store.exists(join(target, n) if n else target) for n in names)


def find_leftovers(
    store: Store,
    key: str,
    *,
    older_than: float = 3600.0,
    claims: bool = False,
    resumable: bool = False,
) -> list[Leftover]:
    """What failed writes left below ``key`` (recursively), untouched for ``older_than``
    seconds; claimed writes only with ``claims`` (a claim is also held by a running writer);
    resumable jobs' staging folders always, to be removed only with ``resumable``."""
    now = time.time()
    out: list[Leftover] = []
    for root, objs in sorted(_group(store, key).items()):
        is_claim = basename(root) == CLAIM or basename(root).startswith(CLAIM + "-")
        if is_claim:
            if not claims:
                continue
            target = _claim_target(root)
            if _committed(store, root, target):
                objs, kind, remove = objs, "claim", (root,)
            else:
                objs = list(_objects(store, target)) if store.is_dir(target) else objs
                if store.exists(target) and not store.is_dir(target):
                    objs = [*objs, (target, store.size(target), None)]
                kind, remove = "unfinished", (target, root)
        elif is_work_name(basename(root)):
            kind, remove = "resumable", (root,) if resumable else ()
        else:
            kind, remove = "staged", (root,)
        times = [t for _, _, t in objs if t is not None]
        age = now - max(times) if times else 0.0
        if age < older_than:
            continue
        shown = remove[0] if remove else root
        out.append(Leftover(kind, store.url(shown), sum(s for _, s, _ in objs), age, remove))
    return out


def clean(
    path: str | os.PathLike[str],
    *,
    older_than: float = 3600.0,
    claims: bool = False,
    resumable: bool = False,
    dry_run: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> list[Leftover]:
    """Remove (unless ``dry_run``) what failed writes left below ``path`` (a local folder or a
    URL), as :func:`find_leftovers` finds it; returns what was (or would be) removed, and the
    resumable staging folders kept (``remove`` empty). DatasetNotFoundError if nothing is at
    ``path``."""
    from lmdata.storage.urls import resolve

    require_exists(path, storage_options)  # a mistyped URL is an error, not "0 leftovers"
    store, key = resolve(path, storage_options)
    found = find_leftovers(store, key, older_than=older_than, claims=claims, resumable=resumable)
    if not dry_run:
        for item in found:
            for k in item.remove:
                store.remove(k)
    return found
