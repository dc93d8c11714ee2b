"""Ranged reads pinned to the version of an object a store first saw, per kind of filesystem.

A pin is ``(size, tag)``: the object's bytes and its version tag where the store has one (the
S3 ETag, the GCS generation, the identity of a ``memory://`` object), learnt from a listing or
HEAD the reader made anyway, or from the first response. Each read checks it at no extra
request: S3 sends ``If-Match: <ETag>`` with the ranged GET (a replaced object answers 412) and
checks the ETag and ``Content-Range`` total of the answer; ``memory://`` compares the object;
other stores compare what a response shows (the bytes returned against the pinned size).
A difference raises :class:`~lmdata.errors.DatasetChangedError`, never mixed bytes.
"""

from __future__ import annotations

from typing import Any

from lmdata.errors import DatasetChangedError
from lmdata.storage._errors import attempts, backoff, is_unreachable

Pin = tuple[int, "str | None"]  # (size, version tag or None)
Groups = list[tuple[int, int]]


def kind(fs: Any) -> str:
    """``s3``, ``memory`` or ``generic``: how ``fs`` reads pinned ranges."""
    name = type(fs).__name__
    if name == "S3FileSystem":
        return "s3"
    if name == "MemoryFileSystem":
        return "memory"
    return "generic"


def changed(url: str, what: str) -> DatasetChangedError:
    return DatasetChangedError(
        f"{what} since this reader opened it; lmdata does not mix the bytes of two versions: "
        "open the dataset again to read what is there now",
        path=url,
    )


def memory_tag(obj: Any) -> str:
    """The identity of one ``memory://`` object (every write makes a new one)."""
    created = getattr(obj, "created", None)
    return f"{id(obj):x}-{created.timestamp() if created is not None else ''}"


def tag_of(fs: Any, k: str, key: str, info: dict[str, Any]) -> str | None:
    """The version tag of ``key`` from its listing or HEAD entry ``info`` (None: no tag)."""
    if k == "memory":
        obj = fs.store.get(key)
        return None if obj is None else memory_tag(obj)
    for field in ("ETag", "etag", "generation"):
        v = info.get(field)
        if v:
            return str(v)
    return None


def check(url: str, pin: Pin | None, size: int | None, tag: str | None) -> None:
    """DatasetChangedError if a response's ``size``/``tag`` contradict ``pin``."""
    if pin is None:
        return
    if tag is not None and pin[1] is not None and tag != pin[1]:
        raise changed(url, "the object was replaced")
    if size is not None and size != pin[0]:
        raise changed(url, f"the object is {size} bytes, not the {pin[0]} it had,")


def fetch(
    fs: Any, k: str, key: str, url: str, groups: Groups, pin: Pin | None
) -> tuple[list[bytes], Pin | None]:
    """The bytes of ``(start, length)`` groups of ``key`` (shorter at the object's end) and
    the pin the answers showed (None where they show none)."""
    if k == "s3":
        return _s3(fs, key, url, groups, pin)
    if k == "memory":
        return _memory(fs, key, url, groups, pin)
    return _generic(fs, key, url, groups, pin)


def _memory(
    fs: Any, key: str, url: str, groups: Groups, pin: Pin | None
) -> tuple[list[bytes], Pin]:
    obj = fs.store.get(key)
    if obj is None:
        if pin is not None:
            raise changed(url, "the object was deleted")
        raise FileNotFoundError(url)
    tag = memory_tag(obj)
    with obj.getbuffer() as buf:
        size = len(buf)
        check(url, pin, size, tag)
        return [bytes(buf[a : a + n]) for a, n in groups], (size, tag)


def _generic(
    fs: Any, key: str, url: str, groups: Groups, pin: Pin | None
) -> tuple[list[bytes], Pin | None]:
    if len(groups) == 1:
        a, n = groups[0]
        blobs = [fs.cat_file(key, start=a, end=a + n)]
    else:
        blobs = fs.cat_ranges(
            [key] * len(groups), [a for a, _ in groups], [a + n for a, n in groups]
        )
    out = []
    for (a, n), blob in zip(groups, blobs, strict=True):
        if isinstance(blob, BaseException):
            if isinstance(blob, FileNotFoundError) and pin is not None:
                raise changed(url, "the object was deleted")
            raise blob
        blob = bytes(blob)
        if pin is not None and len(blob) != max(0, min(n, pin[0] - a)):
            raise changed(url, f"a read at byte {a} got {len(blob)} bytes: the object changed")
        out.append(blob)
    return out, None


def _s3(
    fs: Any, key: str, url: str, groups: Groups, pin: Pin | None
) -> tuple[list[bytes], Pin | None]:
    import asyncio  # here: a local job never imports it (a sixtieth of a second)

    from fsspec.asyn import sync

    bucket, name, version = fs.split_path(key)
    tries = attempts()
    etag = pin[1] if pin is not None else None

    async def one(a: int, n: int) -> tuple[bytes, int | None, str | None]:
        kw: dict[str, Any] = {"Bucket": bucket, "Key": name, "Range": f"bytes={a}-{a + n - 1}"}
        if etag:
            kw["IfMatch"] = etag
        if version:
            kw["VersionId"] = version
        for i in range(tries):
            try:
                resp = await fs._call_s3("get_object", **kw)
            except FileNotFoundError:
                if pin is not None:
                    raise changed(url, "the object was deleted") from None
                raise
            except OSError as e:
                from lmdata.storage._errors import _code

                code = _code(e)
                if code == "PreconditionFailed":
                    raise changed(
                        url, f"the object was replaced (its ETag is no longer {etag})"
                    ) from None
                if code == "InvalidRange":  # at or past the end (a zero-length object too)
                    if pin is not None and a < pin[0]:
                        raise changed(
                            url, f"the object is shorter than the {pin[0]} bytes it had,"
                        ) from None
                    return b"", None, None
                raise
            try:
                body = await resp["Body"].read()
            except Exception as e:  # the connection broke mid-body: botocore does not retry that
                if i + 1 < tries and is_unreachable(e):
                    await asyncio.sleep(backoff(i))
                    continue
                raise
            finally:
                resp["Body"].close()
            total = str(resp.get("ContentRange") or "").rpartition("/")[2]
            return bytes(body), int(total) if total.isdigit() else None, resp.get("ETag")
        raise AssertionError("unreachable")  # pragma: no cover

    async def every() -> list[tuple[bytes, int | None, str | None]]:
        return list(await asyncio.gather(*(one(a, n) for a, n in groups)))

    got = sync(fs.loop, every)
    seen: Pin | None = pin
    for _, size, tag in got:
        if size is None and tag is None:
            continue
        check(url, seen, size, tag)
        if seen is None and size is not None:
            seen = (size, tag)
        elif seen is not None and seen[1] is None and tag is not None:
            seen = (seen[0], tag)  # a pin from a listing without versions
    return [b for b, _, _ in got], seen
