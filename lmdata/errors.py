"""The exceptions lmdata raises: one root, a few kinds, messages that name the place and the fix.

Every error raised while reading a dataset names the file and, where one exists, the position
(byte offset, line, chunk, sample). Subclasses also inherit the matching builtin exception, so
``except ValueError`` or ``except FileNotFoundError`` in existing code keeps working.
"""

from __future__ import annotations

import os

__all__ = [
    "CorruptDataError",
    "DatasetChangedError",
    "DatasetNotFoundError",
    "FormatError",
    "InvalidInputError",
    "LmdataError",
    "MissingDependencyError",
    "OutputExistsError",
    "StorageError",
    "UnsafeDataError",
    "ValidationError",
]


def _where(path: str | os.PathLike[str] | None, position: str | None) -> str:
    parts = []
    if path is not None:
        parts.append(os.fspath(path))
    if position:
        parts.append(position)
    return ": ".join(parts)


class LmdataError(Exception):
    """Root of every exception lmdata raises on purpose.

    ``path`` and ``position`` are kept as attributes so tools can report them; the message
    already contains both. Secrets in URLs (userinfo, signed query values) are masked in both.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        position: str | None = None,
    ) -> None:
        from lmdata._redact import redact  # a URL's userinfo or signed query never shows

        self.path = redact(os.fspath(path)) if path is not None else None
        self.position = position
        where = _where(self.path, position)
        super().__init__(redact(f"{where}: {message}" if where else message))


class FormatError(LmdataError, ValueError):
    """The path is not in the expected format, or its format cannot be told."""


class CorruptDataError(LmdataError, ValueError):
    """The data contradicts its own metadata: truncated, garbled or inconsistent bytes."""


class DatasetChangedError(CorruptDataError):
    """An object a reader opened was replaced, changed or deleted under it: the reader refuses
    to mix versions. Open the dataset again to read what is there now."""


class UnsafeDataError(LmdataError, ValueError):
    """Reading the data would run code or allocate without bound; refused by default."""


class ValidationError(LmdataError, ValueError):
    """``validate`` found problems; ``problems`` lists them one per entry."""

    def __init__(self, message: str, problems: list[str], **kw: object) -> None:
        self.problems = problems
        super().__init__(message, **kw)  # type: ignore[arg-type]


class InvalidInputError(LmdataError, ValueError):
    """A value handed to a writer or a tool cannot be stored as asked."""


class MissingDependencyError(LmdataError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""


class DatasetNotFoundError(LmdataError, FileNotFoundError):
    """Nothing exists at the path given."""


class OutputExistsError(LmdataError, FileExistsError):
    """A writer would replace an existing output; pass ``overwrite=True`` to allow it."""


class StorageError(LmdataError, OSError):
    """A store could not serve a request (unreachable, refused, timed out, throttled) after
    lmdata's retries; the message names the URL and what to check or retry."""
