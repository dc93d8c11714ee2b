"""Side virtual environments holding the origin tools, created once under .venv/bench-<tool>/.

`make bench` compares lmdata with the origin tools themselves. They are never installed into
.venv (their pins clash with lmdata's); each gets its own venv, built once and marked by a stamp
file holding its requirements, so later runs reuse it. A tool that cannot be installed is
reported as unavailable (with pip's last lines) and its rows say so; the other rows still run.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / ".venv"
TORCH_WHEEL = "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"

# dolma 1.2.1's resolver stalls on the s3 stack unless these are pinned together.
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "dolma": (
        "dolma==1.2.1",
        "fsspec==2023.6.0",
        "s3fs==2023.6.0",
        "aiobotocore==2.5.4",
        "botocore==1.31.17",
        "boto3==1.28.17",
    ),
    # torch from local disk: a plain `torch` pulls GBs of CUDA wheels.
    "modalities": (
        TORCH_WHEEL,
        "modalities==0.5.0",
        "transformers==4.57.6",
        "tokenizers==0.22.2",
    ),
    "streaming": ("mosaicml-streaming==0.13.0",),
    # the training loader's peers (bench_loader.py); litdata needs torch, from local disk
    "grain": ("grain==0.2.18",),
    "litdata": (TORCH_WHEEL, "litdata==0.2.76"),
    "zarr2": ("zarr>=2.18,<3",),
    # MinHash peers (bench_minhash.py): datasketch's MinHashLSH and rensa's signatures
    "datasketch": ("datasketch==2.0.0", "rensa==0.5.0"),
    "zarr3": ("zarr>=3,<4",),
}
# Environments made earlier by `make install` that already hold the tool.
REUSE = {
    "streaming": VENVS / "extra-streaming",
    "zarr2": VENVS / "extra-zarr2",
    "datasketch": VENVS / "extra-datasketch",
}


@dataclass(frozen=True)
class Env:
    """One origin tool's interpreter, or why it is missing."""

    tool: str
    python: Path | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.python is not None


def ensure(tool: str, log=print) -> Env:
    """Return the venv for `tool`, creating and installing it on first use."""
    reqs = REQUIREMENTS[tool]
    reuse = REUSE.get(tool)
    if reuse is not None and (reuse / "bin" / "python").exists():
        return Env(tool, reuse / "bin" / "python")
    path = VENVS / f"bench-{tool}"
    stamp = path / ".bench-stamp"
    python = path / "bin" / "python"
    want = "\n".join(reqs)
    if stamp.exists() and stamp.read_text() == want and python.exists():
        return Env(tool, python)
    failed = path / ".bench-failed"
    if failed.exists() and failed.read_text().startswith(want + "\n---\n"):
        return Env(tool, None, failed.read_text().split("\n---\n", 1)[1])
    log(f"[envs] creating {path} for {tool} (once; slow) ...", flush=True)
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(path)
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *reqs],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        failed.write_text(want + "\n---\n" + tail)
        return Env(tool, None, tail)
    stamp.write_text(want)
    failed.unlink(missing_ok=True)
    return Env(tool, python)


def main() -> None:
    """`python bench/envs.py [tool ...]`: create the side environments ahead of a run."""
    for tool in sys.argv[1:] or list(REQUIREMENTS):
        env = ensure(tool)
        print(f"{tool}: {env.python if env.ok else 'unavailable: ' + env.error}", flush=True)


if __name__ == "__main__":
    main()
