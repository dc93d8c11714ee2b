"""A script without ``if __name__ == "__main__":`` whose local workers are spawned (as they are
after ``ray.init()``) fails at once with one line naming the fix, instead of running itself
again in every worker. Real scripts, run in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent

HEAD = """\
import os, sys
from lmdata.tokenize.api import tokenize

os.write(1, f"top level {__name__}\\n".encode())  # one write: workers print it too

def job(dst, **kw):
    s = tokenize(sys.argv[1], dst, format="flat-tokens", workers=2, overwrite=True, **kw)
    print("wrote", s.documents_written, flush=True)
"""
# with Ray: a job on the Ray engine first (it starts Ray here, whose threads make the local
# engine spawn its workers), then one on the local engine
RAY_JOB = 'job(sys.argv[2] + "-ray", engine="ray", address="local")\n'
LOCAL_JOB = "job(sys.argv[2])\n"


def _script(tmp_path: Path, guarded: bool, ray: bool = False) -> Path:
    jobs = (RAY_JOB if ray else "") + LOCAL_JOB
    if guarded:
        jobs = 'if __name__ == "__main__":\n' + textwrap.indent(jobs, "    ")
    path = tmp_path / ("guarded.py" if guarded else "flat.py")
    path.write_text(HEAD + jobs)
    return path


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    d = tmp_path / "docs"
    d.mkdir()
    for k in range(4):  # several files: several units, so the local engine starts workers
        with open(d / f"d{k}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": f"document {i} " * 30}) + "\n" for i in range(200))
    return d


def _run(script: Path, docs: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(script), str(docs), str(tmp_path / "out")],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )


def _driver_lines(out: subprocess.CompletedProcess) -> list[str]:
    return [x for x in out.stdout.splitlines() if x != "top level __mp_main__"]


@pytest.mark.parametrize("guarded", [False, True])
def test_a_spawning_script_needs_its_main_guard(tmp_path: Path, docs: Path, guarded: bool) -> None:
    script = _script(tmp_path, guarded)
    out = _run(script, docs, tmp_path, LMDATA_START_METHOD="spawn")
    if guarded:
        assert out.returncode == 0, out.stderr
        # each worker imports the script (its top level prints), the guarded job runs once
        assert _driver_lines(out) == ["top level __main__", "wrote 800"]
        return
    assert out.returncode == 1
    # the script ran once (no worker ran it again as __mp_main__) and wrote nothing
    assert out.stdout.splitlines() == ["top level __main__"]
    assert "bootstrapping" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("lmdata.errors.InvalidInputError: ")
    assert f"{script}:{script.read_text().count(chr(10))}" in last  # the line that asked
    assert 'put the script\'s code under `if __name__ == "__main__":`' in last
    assert not (tmp_path / "out").exists()


def test_a_forking_script_needs_no_guard(tmp_path: Path, docs: Path) -> None:
    out = _run(_script(tmp_path, False), docs, tmp_path, LMDATA_START_METHOD="fork")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["top level __main__", "wrote 800"]


def test_guard_found_around_a_call_from_a_function() -> None:
    from lmdata.parallel import _guard

    src = textwrap.dedent(
        """\
        def main():
            pass
        x = 1
        if "__main__" == __name__:
            if x:
                main()
        """
    )
    ranges = _guard._guarded_lines("s.py", src)
    assert ranges == ((5, 6),)


@pytest.mark.parametrize("guarded", [False, True])
def test_after_ray_init_a_flat_script_fails_at_once(
    tmp_path: Path, docs: Path, guarded: bool
) -> None:
    """The case as a user meets it: a Ray job, then a local one, in a flat script (Ray's
    threads make the local engine spawn). Real local Ray."""
    pytest.importorskip("ray")
    script = _script(tmp_path, guarded, ray=True)
    out = _run(script, docs, tmp_path)
    if guarded:
        assert out.returncode == 0, out.stderr
        assert _driver_lines(out) == ["top level __main__", "wrote 800", "wrote 800"]
        return
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == ["top level __main__", "wrote 800"]
    assert "bootstrapping" not in out.stderr and "FileNotFoundError" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert 'put the script\'s code under `if __name__ == "__main__":`' in last
    assert "after ray.init()" in last
