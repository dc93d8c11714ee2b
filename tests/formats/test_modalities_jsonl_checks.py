"""modalities-jsonl validate: bounded on huge lines (memory, address space) and never calling
detectable damage valid (a line appended after indexing, an index cut to nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

import lmdata
from lmdata.errors import CorruptDataError
from lmdata.formats import modalities_jsonl as mj

RECS = [{"text": f"document {i}", "id": i} for i in range(20)]


def _written(tmp_path: Path) -> Path:
    p = tmp_path / "docs.jsonl"
    with mj.Writer(p, manifest=False) as w:
        for r in RECS:
            w.write(r)
    return p


def _grow(p: Path, extra: int) -> int:
    """Append ``extra`` zero bytes without a newline, as a hole (no disk used); the old size."""
    size = p.stat().st_size
    os.truncate(p, size + extra)
    return size


def test_a_huge_unterminated_tail_is_reported_in_bounded_memory(tmp_path: Path) -> None:
    p = _written(tmp_path)
    start = _grow(p, 512 << 20)
    tracemalloc.start()
    try:
        problems = mj.validate(p, max_line_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 300 << 20  # a window or two; keeping the tail would take 512 MiB
    assert len(problems) == 1
    assert (
        f"line {len(RECS) + 1} (byte {start}): {512 << 20:,} bytes, not in the index"
        in (problems[0])
    )
    assert "max_line_bytes" in problems[0]
    assert len(mj.open(p)) == len(RECS)  # the reader never looks past the indexed lines


def test_long_lines_within_the_bound_are_still_checked(tmp_path: Path) -> None:
    p = _written(tmp_path)
    with open(p, "ab") as f:
        f.write(b"x" * 5000)  # a short unterminated tail that is not JSON
    problems = mj.validate(p, max_line_bytes=1 << 20)
    assert len(problems) == 1 and "the last 5000 bytes" in problems[0]
    assert "write cut short" in problems[0]
    problems = mj.validate(p, max_line_bytes=100)
    assert len(problems) == 1 and "5,000 bytes, not in the index" in problems[0]
    with pytest.raises(ValueError, match="max_line_bytes"):
        mj.validate(p, max_line_bytes=0)


def test_under_an_address_space_limit(tmp_path: Path) -> None:
    """validate streams (no mapping of the file); where a reader must map it, the limit is an
    lmdata error naming the file, not a raw OSError from mmap."""
    p = _written(tmp_path)
    _grow(p, 3 << 29)
    warm = tmp_path / "warm" / "docs.jsonl"
    warm.parent.mkdir()
    _written(warm.parent)
    script = textwrap.dedent(
        f"""
        import json, resource
        import lmdata
        from lmdata.errors import LmdataError
        from lmdata.formats import modalities_jsonl as mj
        from lmdata.storage import LocalStore
        mj.validate({str(warm)!r})  # warm: every import done
        lmdata.open({str(warm)!r})[3]
        with open("/proc/self/status") as f:
            vm = next(int(x.split()[1]) for x in f if x.startswith("VmSize:")) << 10
        # room for the default max_line_bytes (256 MiB) and a window, not for the file's 1.5 GiB
        limit = vm + (768 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        out = {{"problems": mj.validate({str(p)!r})}}
        for name, call in (
            ("mmap", lambda: LocalStore().mmap({str(p)!r})),
            ("read", lambda: lmdata.open({str(p)!r})[3]),
        ):
            try:
                call()
                out[name] = "no error"
            except LmdataError as e:
                out[name] = ["LmdataError", str(e), e.path]
            except BaseException as e:
                out[name] = [type(e).__name__, str(e), None]
        print(json.dumps(out))
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out["problems"]) == 1 and "not in the index" in out["problems"][0]
    for name in ("mmap", "read"):
        kind, message, path = out[name]
        assert kind == "LmdataError" and path == str(p), out[name]
        assert "memory-map" in message and "ulimit -v" in message


def test_a_line_appended_after_indexing_is_reported(tmp_path: Path) -> None:
    p = _written(tmp_path)
    size = p.stat().st_size
    with open(p, "ab") as f:
        f.write(b"not json at all\n")
    problems = mj.validate(p)
    assert len(problems) == 1
    assert f"line {len(RECS) + 1} (byte {size}): not JSON" in problems[0]
    assert "appended after indexing" in problems[0]
    assert list(mj.open(p)) == RECS  # what readers return is unchanged
    with open(p, "ab") as f:
        f.write(b"\n")  # and an empty line after it
    assert len(mj.validate(p)) == 2


def test_an_empty_index_is_no_plain_jsonl(tmp_path: Path) -> None:
    p = _written(tmp_path)
    idx = p.with_suffix(".idx")
    idx.write_bytes(b"")
    assert lmdata.detect(p) == "modalities-jsonl"
    problems = lmdata.validate(p)
    assert len(problems) == 1 and str(idx) in problems[0] and "empty (0 bytes)" in problems[0]
    with pytest.raises(CorruptDataError, match="empty") as e:
        lmdata.open(p)
    assert e.value.path == str(idx)
    idx.unlink()  # no index at all: plain JSONL, as before
    assert lmdata.detect(p) == "jsonl" and lmdata.validate(p) == []


def test_the_origin_files_still_validate_clean() -> None:
    data = Path(__file__).parents[1] / "data" / "modalities" / "docs.jsonl"
    assert lmdata.detect(data) == "modalities-jsonl"
    assert lmdata.validate(data) == []
    assert json.loads(data.read_text().splitlines()[0]) == lmdata.open(data)[0]
