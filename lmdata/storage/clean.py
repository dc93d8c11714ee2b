"""Finding and removing what killed writers left: staged outputs, claims and cut-short commits.

A writer that dies leaves objects named so they can be found: ``.lmdata-tmp-NAME-<id>`` (an
output staged beside its destination: a local temporary directory or file, or the new objects
of a staged write on an object store), and on object stores its claim ``.lmdata-writing-NAME``
(``lmdata.storage.claims``), which says what the write got to: a commit that finished (only
the claim is left over), a staged commit cut short (finished now, rolled forward from the
staged copies: the new dataset), or a write that never committed (its objects go: the staged
copies, or a new dataset's objects under their final names). A commit cut short also leaves
its marker in a tree (``.lmdata-committing``), which is found too. Only leftovers untouched for
``older_than`` seconds count, so a running writer keeps its own, except a claim whose writer is
provably gone (a process of this machine that ended) or whose commit finished. A staged output
named by a claim goes with its claim. A last kind is kept unless asked for: the staging folder
(``.NAME.lmdata-work``, ``.NAME.lmdata-convert``) an interrupted tokenize or convert keeps for
``--resume``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lmdata.errors import InvalidInputError
from lmdata.storage import claims as claims_mod
from lmdata.storage.base import Store, basename, join
from lmdata.storage.claims import Claim, claim_key
from lmdata.storage.paths import CLAIM, COMMITTING, TMP_PREFIX, is_work_name

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Leftover:
    """One thing a failed write left: ``kind`` is ``staged`` (a ``.lmdata-tmp-`` output),
    ``unfinished`` (a claimed write that never committed: its objects and claim),
    ``committing`` (a staged commit cut short: finished from its staged copies), ``claim``
    (the claim of a write that committed) or ``resumable`` (an interrupted tokenize's or
    convert's staging, which ``--resume`` continues); ``remove`` lists the keys that go (none
    for a resumable folder kept)."""

    kind: str
    url: str
    bytes: int
    age: float  # seconds since anything below it last changed
    remove: tuple[str, ...]
    claim: Claim | None = None  # settled (rolled forward or removed) through its claim


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
    resumable job's staging folder (the topmost), or a claim or commit marker (its key)."""
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
            if parts and (_is_claim(parts[-1]) or parts[-1] == COMMITTING):
                out.setdefault(k, []).append((k, size, mtime))
    if _topmost(basename(base)):  # the URL given is itself a leftover
        out = {base: [o for objs in out.values() for o in objs]} if out else out
    return out


def _is_claim(name: str) -> bool:
    return name == CLAIM or name.startswith(CLAIM + "-")


def _claims(store: Store, key: str, groups: dict[str, Any]) -> dict[str, Claim]:
    """The claims among ``groups`` and the one beside ``key`` itself, read, with the marker of
    a cut-short commit standing for its claim where that is gone."""
    fs = getattr(store, "fs", None)
    if fs is None:
        return {}
    found: dict[str, Claim] = {}
    beside = claim_key(key.rstrip("/"))
    if beside not in groups and basename(key.rstrip("/")):
        try:
            info = fs.info(beside)
        except (FileNotFoundError, OSError):
            info = None
        if info is not None and info.get("type") != "directory":
            groups[beside] = [(beside, int(info.get("size") or 0), _mtime(info))]
    for root in sorted(groups):
        if _is_claim(basename(root)):
            c = claims_mod.inspect(store, root)  # type: ignore[arg-type]
            if c is not None:
                found[root] = c
    for root in sorted(groups):
        if basename(root) != COMMITTING:
            continue
        info = claims_mod.read_claim(store, root)  # type: ignore[arg-type]
        mark = info.get("marker") if info else None
        if not isinstance(mark, str) or not root.endswith("/" + mark):
            continue
        claim = claim_key(root[: -len(mark) - 1])
        if claim not in found:
            c = claims_mod.inspect(store, claim, info)  # type: ignore[arg-type]
            if c is not None:
                found[claim] = c
                groups[claim] = groups[root]
    return found


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
    groups = _group(store, key)
    found = _claims(store, key, groups)
    claimed_stages = {k for c in found.values() for k in c.staged}
    for root, objs in sorted(groups.items()):
        c = found.get(root)
        if _is_claim(basename(root)) or basename(root) == COMMITTING:
            if c is None or not claims:
                continue
            objs = [*objs, *_below(store, c.stage or (c.dest if c.outcome == "unfinished" else ""))]
            age = _age(now, objs)
            if not claims_mod.may_settle(c, older_than, age):
                continue
            kind = {"finished": "claim", "committing": "committing"}.get(c.outcome, "unfinished")
            shown = {"claim": c.key, "committing": c.dest}.get(kind)
            shown = shown or (c.stage if c.stage is not None else c.dest)
            size = sum(s for k, s, _ in objs if kind != "claim" or k == c.key)
            out.append(Leftover(kind, store.url(shown), size, age, c.removes(), c))
            continue
        if root in claimed_stages:
            continue  # goes with its claim (--claims), never on its own
        if is_work_name(basename(root)):
            kind, remove = "resumable", (root,) if resumable else ()
        else:
            kind, remove = "staged", (root,)
        age = _age(now, objs)
        if age < older_than:
            continue
        shown = remove[0] if remove else root
        out.append(Leftover(kind, store.url(shown), sum(s for _, s, _ in objs), age, remove))
    return out


def _age(now: float, objs: list[tuple[str, int, float | None]]) -> float:
    times = [t for _, _, t in objs if t is not None]
    return now - max(times) if times else 0.0


def _below(store: Store, key: str) -> list[tuple[str, int, float | None]]:
    """Every object below ``key`` (or ``key`` itself, an object); none for ``""``."""
    if not key or not store.exists(key):
        return []
    if not store.is_dir(key):
        return [(key, store.size(key), None)]
    return list(_objects(store, key))


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
    URL), as ``find_leftovers`` finds it; returns what was (or would be) removed, and the
    resumable staging folders kept (``remove`` empty). DatasetNotFoundError if nothing is at
    ``path``."""
    from lmdata.storage.urls import require_exists, resolve

    require_exists(path, storage_options)  # a mistyped URL is an error, not "0 leftovers"
    store, key = resolve(path, storage_options)
    found = find_leftovers(store, key, older_than=older_than, claims=claims, resumable=resumable)
    if not dry_run:
        for item in found:
            if item.claim is not None:
                claims_mod.settle(store, item.claim)  # type: ignore[arg-type]
                continue
            for k in item.remove:
                store.remove(k)
    return found
