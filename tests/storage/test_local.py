"""The local store's outputs: streamed writes are buffered, and appear only on commit."""

from __future__ import annotations

import os

from lmdata.storage import LocalStore


def test_open_write_buffers_small_pieces(tmp_path):
    out = LocalStore().output(str(tmp_path / "f.bin"), directory=False, overwrite=False)
    f = out.open_write("")
    for _ in range(4000):
        f.write(b"x" * 100)  # 400 kB in small pieces, as record writers append them
    # still in the buffer: an unbuffered or default-buffered (8 KiB) file has written most of it
    assert os.path.getsize(out.tmp) == 0
    f.close()
    assert not (tmp_path / "f.bin").exists()
    out.commit()
    assert (tmp_path / "f.bin").read_bytes() == b"x" * 400_000
