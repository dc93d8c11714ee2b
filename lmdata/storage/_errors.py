"""Store failures as lmdata errors, and how hard a store tries before one is raised.

Every request lmdata sends to an fsspec filesystem goes through :class:`Guarded` (the ``fs`` of
an :class:`~lmdata.storage.FsspecStore`): a failure of the store itself (unreachable endpoint,
timeout, refused credentials, a missing bucket, an invalid bucket name, throttling after the
retries) leaves it as a :class:`~lmdata.errors.StorageError` (or ``DatasetNotFoundError``,
``InvalidInputError``) naming the URL, secrets masked, and saying what to do. The exceptions
that carry meaning for the caller (``FileNotFoundError``, ``FileExistsError``, ...) pass as
they are.

Retries: S3 requests use botocore's *standard* retry mode (connection errors, timeouts, 5xx,
``SlowDown`` and other throttling answers), :data:`ATTEMPTS` attempts in all with exponential
backoff (a random delay up to 1, 2, 4, 8 s ... between attempts, at most 20 s), and bounded
connect and read timeouts; ``LMDATA_STORE_ATTEMPTS`` or the storage option
``config_kwargs.retries`` changes them. An endpoint that stays unreachable through them all is
taken as down for :data:`DOWN_SECONDS`: the calls that follow (an abort's clean-up) fail at
once instead of waiting through the retries again.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from lmdata._redact import redact
from lmdata.errors import (
    DatasetNotFoundError,
    InvalidInputError,
    LmdataError,
    MissingDependencyError,
    StorageError,
)

DEFAULT_ATTEMPTS = 5
CONNECT_TIMEOUT = 10  # seconds to open a connection
READ_TIMEOUT = 60  # seconds without a byte from the server
DOWN_SECONDS = 10.0

# exceptions that keep their meaning for the code calling the store
_PASS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError)
# names of exception types that say the server could not be reached or went away
_UNREACHABLE = {
    "EndpointConnectionError",
    "HTTPClientError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ProxyConnectionError",
    "ResponseStreamingError",
    "ClientConnectorError",
    "ClientConnectionError",
    "ClientOSError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ClientPayloadError",
    "IncompleteRead",
    "FSTimeoutError",
    "TimeoutError",
    "timeout",
}
_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
_DENIED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
    "403",
}
_BUSY_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "500",
    "502",
    "503",
    "504",
}


def attempts() -> int:
    """Attempts per request before a transient failure is raised (``LMDATA_STORE_ATTEMPTS``,
    at least 1; default :data:`DEFAULT_ATTEMPTS`)."""
    raw = os.environ.get("LMDATA_STORE_ATTEMPTS", "").strip()
    try:
        return max(1, int(raw)) if raw else DEFAULT_ATTEMPTS
    except ValueError:
        raise InvalidInputError(
            f"LMDATA_STORE_ATTEMPTS={raw!r} is not a whole number (attempts per request, "
            f"e.g. {DEFAULT_ATTEMPTS})"
        ) from None


def with_defaults(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with lmdata's timeouts and retries for ``protocol`` filled in where the
    user gave none (S3: botocore's standard retry mode, bounded connect/read timeouts)."""
    if protocol not in ("s3", "s3a"):
        return dict(options)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", CONNECT_TIMEOUT)
    config.setdefault("read_timeout", READ_TIMEOUT)
    config.setdefault("retries", {"mode": "standard", "total_max_attempts": attempts()})
    return {**options, "config_kwargs": config}


def tune(fs: Any) -> None:
    """Settings a filesystem takes as attributes: s3fs's own retry loop would retry what
    botocore gave up on, multiplying the waits (lmdata retries a broken body read itself)."""
    if type(fs).__name__ == "S3FileSystem":
        fs.retries = 1


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (full jitter, as botocore's)."""
    import random

    return float(min(20.0, random.random() * (2**attempt)))


def _code(exc: BaseException) -> str:
    """The S3 error code (or HTTP status) behind ``exc``, if it came from a response."""
    for e in _chain(exc):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            err = resp.get("Error") or {}
            code = err.get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code:
                return str(code)
    return ""


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in out and len(out) < 8:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for e in _chain(exc) for c in type(e).__mro__}


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return redact(text[:300] + ("..." if len(text) > 300 else ""))


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached or went away mid-request."""
    if isinstance(exc, StorageError):
        return bool(getattr(exc, "unreachable", False))
    names = _names(exc)
    if names & _UNREACHABLE:
        return True
    # asyncio's TimeoutError (its own class before Python 3.11) exists only once asyncio is
    # imported: a local job does not import it (a sixtieth of a second of start-up)
    aio = sys.modules.get("asyncio")
    timeouts = (aio.TimeoutError,) if aio is not None else ()
    return isinstance(exc, (ConnectionError, socket.timeout, *timeouts))


_STORE_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "fsspec", "google")


def from_store(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is an exception of a store's client."""
    return any(
        type(e).__module__.split(".")[0] in _STORE_MODULES for e in _chain(exc)
    ) or is_unreachable(exc)


def translate(exc: BaseException, url: str | None, tries: int | None = None) -> BaseException:
    """The lmdata error for a failure of a store request about ``url``; ``exc`` itself if it
    is an lmdata error, keeps a meaning for the caller (no such object, exists, ...), or is no
    store failure (a bug is reported as one)."""
    url = redact(url) if url else None
    if isinstance(exc, LmdataError):
        return exc
    names = _names(exc)
    code = _code(exc)
    n = attempts() if tries is None else tries
    after = f" after {n} attempts" if n > 1 else ""
    if "ParamValidationError" in names:
        return InvalidInputError(
            f"not a valid object-store URL ({_short(exc)}); bucket names are 3-63 lower-case "
            "letters, digits, dots and hyphens: check the URL",
            path=url,
        )
    if code == "NoSuchBucket" or "bucket does not exist" in str(exc).lower():
        return DatasetNotFoundError(
            "the bucket does not exist: check the URL (and the endpoint), or create the bucket",
            path=url,
        )
    if isinstance(exc, _PASS):
        return exc
    if names & _CREDENTIALS:
        return StorageError(
            f"no usable credentials ({_short(exc)}): pass them as storage options (key=, "
            "secret=, profile=) or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            path=url,
        )
    if isinstance(exc, PermissionError) or code in _DENIED_CODES:
        return StorageError(
            f"access denied ({_short(exc)}): check the credentials and that they may use "
            "this bucket (storage options key/secret/profile, AWS_* variables)",
            path=url,
        )
    if is_unreachable(exc):
        err = StorageError(
            f"cannot reach the object store{after} ({type(exc).__name__}: {_short(exc)}): "
            "check the endpoint (storage option client_kwargs.endpoint_url, AWS_ENDPOINT_URL) "
            "and the network, then retry",
            path=url,
        )
        err.unreachable = True  # type: ignore[attr-defined]
        return err
    if code in _BUSY_CODES or getattr(exc, "errno", None) == errno.EREMOTEIO:
        return StorageError(
            f"the object store is unavailable or throttling requests{after} ({code or 'error'}: "
            f"{_short(exc)}); retry later",
            path=url,
        )
    if isinstance(exc, ImportError):
        return MissingDependencyError(f"{_short(exc)}", path=url)
    if isinstance(exc, OSError) or from_store(exc):
        return StorageError(
            f"the store failed the request ({_short(exc)}); retry, or check the URL, the "
            "endpoint and the credentials",
            path=url,
        )
    return exc


def _url_of(protocol: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The URL a filesystem call is about: its first path argument."""
    first: Any = args[0] if args else kwargs.get("path", kwargs.get("path1", ""))
    if isinstance(first, (list, tuple)):
        first = first[0] if first else ""
    if isinstance(first, dict):
        first = next(iter(first), "")
    text = str(first)
    return text if "://" in text else f"{protocol}://{text.lstrip('/')}"


class _Down:
    """Endpoints found unreachable through all their retries, until when (per process), and
    what their failure said."""

    def __init__(self) -> None:
        self._until: dict[int, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def check(self, fs: Any, url: str) -> None:
        got = self._until.get(id(fs))
        if got is None:
            return
        until, said = got
        if time.monotonic() >= until:
            with self._lock:
                self._until.pop(id(fs), None)
            return
        err = StorageError(
            f"{said} (the same endpoint failed moments ago: not asked again for "
            f"{DOWN_SECONDS:g} s)",
            path=redact(url),
        )
        err.unreachable = True  # type: ignore[attr-defined]
        raise err

    def mark(self, fs: Any, err: BaseException) -> None:
        said = str(err)
        path = getattr(err, "path", None)
        if path and said.startswith(f"{path}: "):
            said = said[len(path) + 2 :]
        with self._lock:
            self._until[id(fs)] = (time.monotonic() + DOWN_SECONDS, said)

    def clear(self, fs: Any) -> None:
        if self._until:
            with self._lock:
                self._until.pop(id(fs), None)


DOWN = _Down()


def guard(fs: Any, protocol: str, fn: Callable[..., Any], url: str) -> Callable[..., Any]:
    """``fn`` (a call on ``fs``) with its store failures raised as lmdata errors."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        DOWN.check(fs, url)
        try:
            out = fn(*args, **kwargs)
        except BaseException as e:
            if not isinstance(e, Exception):
                raise
            err = translate(e, url)
            if err is e:
                raise
            if is_unreachable(err):
                DOWN.mark(fs, err)
            raise err from e
        if DOWN._until:
            DOWN.clear(fs)
        return out

    return call


class Guarded:
    """An fsspec filesystem whose public calls raise lmdata errors for store failures, and
    whose files do so on read, write and close (see :func:`translate`)."""

    def __init__(self, fs: Any, protocol: str) -> None:
        self.__dict__["_fs"] = fs
        self.__dict__["_protocol"] = protocol

    @property
    def raw(self) -> Any:
        """The filesystem itself (for lmdata's own request paths, which translate errors)."""
        return self._fs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name.startswith("_") or not callable(attr):
            return attr
        fs, protocol = self._fs, self._protocol

        def call(*args: Any, **kwargs: Any) -> Any:
            url = _url_of(protocol, args, kwargs)
            out = guard(fs, protocol, attr, url)(*args, **kwargs)
            if name == "open":
                return GuardedFile(out, fs, protocol, url)
            return out

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._fs, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._fs, name)

    def __repr__(self) -> str:
        return f"Guarded({type(self._fs).__name__})"


class GuardedFile:
    """A file of a :class:`Guarded` filesystem: reads, writes and close raise lmdata errors
    for store failures (an upload fails at write or close)."""

    def __init__(self, f: Any, fs: Any, protocol: str, url: str) -> None:
        self.__dict__.update(_f=f, _fs=fs, _protocol=protocol, _url=url)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._f, name)
        if name in ("read", "readinto", "write", "flush", "close", "seek", "readline", "commit"):
            return guard(self._fs, self._protocol, attr, self._url)
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._f, name, value)

    def __enter__(self) -> GuardedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Any:
        return iter(self._f)
