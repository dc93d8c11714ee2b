"""Build locally, then upload: the output ``store.output(..., local=True)`` gives on object stores.

Some writers need a seekable file or a folder they can rename in (a ``.pbin`` header patched
at close, Atlas shards renamed as they finish). :class:`SpooledOutput` hands them a local
temporary file or folder (:attr:`SpooledOutput.tmp`) and, at commit, uploads it through the
store's own output: every file, then those given to :meth:`SpooledOutput.write_last` in that
order, so the store's commit rules (claims, metadata last) hold as for any writer.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from lmdata.storage.base import Output
from lmdata.storage.local import TmpWrites

_COPY = 8 << 20  # bytes per upload write


class SpooledOutput(TmpWrites):
    """An :class:`~lmdata.storage.Output` built in a local temporary path, uploaded through
    ``inner`` (an object store's output) at :meth:`commit`; :meth:`abort` removes both."""

    sparse = True

    def __init__(self, inner: Output, *, directory: bool) -> None:
        self.inner = inner
        self.store = inner.store
        self.dest = inner.dest
        self.directory = directory
        self._dir = tempfile.mkdtemp(prefix=".lmdata-spool-")
        self.tmp: str | None = os.path.join(self._dir, "ds")
        if directory:
            os.mkdir(self.tmp)
        self._last: list[str] = []
        self._done = False

    def write_last(self, name: str, data: bytes) -> None:
        """Put ``name`` in the local folder and upload it after every other file."""
        self._replace(name, data)
        if name in self._last:
            self._last.remove(name)
        self._last.append(name)

    def _files(self) -> list[str]:
        """Every file below the local folder (names relative to it), sorted."""
        assert self.tmp is not None
        out = []
        for root, _dirs, files in os.walk(self.tmp):
            for f in files:
                out.append(os.path.relpath(os.path.join(root, f), self.tmp).replace(os.sep, "/"))
        return sorted(out)

    def _upload(self, name: str) -> None:
        with open(self._path(name), "rb") as src, self.inner.open_write(name) as dst:
            shutil.copyfileobj(src, dst, _COPY)

    def commit(self) -> None:
        if self._done:
            return
        try:
            if not self.directory:
                if "" in self._last:
                    with open(self._path(""), "rb") as f:
                        self.inner.write_last("", f.read())
                else:
                    self._upload("")
            else:
                last = set(self._last)
                for name in self._files():
                    if name not in last:
                        self._upload(name)
                for name in self._last:
                    with open(self._path(name), "rb") as f:
                        self.inner.write_last(name, f.read())
            self.inner.commit()
        except BaseException:
            self.abort()
            raise
        self._done = True
        shutil.rmtree(self._dir, ignore_errors=True)

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.inner.abort()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def done(self) -> bool:
        return self._done
