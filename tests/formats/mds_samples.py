"""Sample recipes shared by the lmdata tests and the streaming helper (runs in both venvs).

Pure functions of (recipe, n): both sides build identical samples without passing objects
between interpreters. :func:`canonical` turns decoded samples into plain comparable values.
"""

from __future__ import annotations

import io
from decimal import Decimal
from typing import Any

import numpy as np

RECIPES = ("all", "images", "pkl", "tokens", "text", "xsv", "mdstext")


def _image(i: int, mode: str = "RGB") -> Any:
    from PIL import Image

    arr = (np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3) * (i + 1)).astype(np.uint8)
    img = Image.fromarray(arr, "RGB")
    return img.convert(mode) if mode != "RGB" else img


def _jpeg_bytes(i: int) -> bytes:
    out = io.BytesIO()
    _image(i).save(out, format="JPEG")
    return out.getvalue()


def columns(recipe: str) -> dict[str, str]:
    if recipe == "all":
        cols = {
            "b": "bytes",
            "s": "str",
            "i": "int",
            "si": "str_int",
            "sf": "str_float",
            "sd": "str_decimal",
            "nd": "ndarray",
            "ndt": "ndarray:int32",
            "ndf": "ndarray:float32:2,3",
            "js": "json",
        }
        for t in (
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "int8",
            "int16",
            "int32",
            "int64",
            "float16",
            "float32",
            "float64",
        ):
            cols[f"x_{t}"] = t
        return cols
    if recipe == "images":
        return {
            "pil": "pil",
            "jpeg": "jpeg",
            "png": "png",
            "lpil": "list[pil]",
            "ljpeg": "list[jpeg]",
            "lpng": "list[png]",
            "ja": "jpeg_array",
        }
    if recipe == "pkl":
        return {"p": "pkl", "id": "int"}
    if recipe == "tokens":
        return {"tokens": "ndarray:uint32"}
    if recipe in ("text", "xsv"):
        return {"id": "int", "txt": "str", "score": "float"}
    if recipe == "mdstext":
        return {"id": "int", "txt": "str", "score": "float64"}
    if recipe == "benchtext":
        return {"id": "int", "text": "str", "meta": "json"}
    if recipe == "benchtokens":
        return {"tokens": "ndarray:uint32"}
    raise ValueError(recipe)


def sample(recipe: str, i: int) -> dict[str, Any]:
    if recipe == "all":
        dims = (i % 3 + 1, 300 if i % 7 == 0 else 2)  # 300 forces a uint16 shape
        out: dict[str, Any] = {
            "b": bytes(range(i % 256)) * 2,
            "s": "héllo ✓ " * (i % 5),
            "i": i * 7919 - 10**12,
            "si": 10**30 + i,
            "sf": i / 7,
            "sd": Decimal(f"{i}.{i:03}"),
            "nd": (np.arange(dims[0] * dims[1]) * (i + 1))
            .astype(["uint8", "int16", "float64", "uint32", "int64"][i % 5])
            .reshape(dims),
            "ndt": np.arange(i % 9 + 1, dtype=np.int32) - 4,
            "ndf": np.full((2, 3), i / 2, dtype=np.float32),
            "js": {"k": [i, None, True, "x" * (i % 3)], "f": i / 3},
        }
        for t in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"):
            info = np.iinfo(t)
            out[f"x_{t}"] = getattr(np, t)(info.max if i % 4 == 0 else info.min + i)
        for t in ("float16", "float32", "float64"):
            out[f"x_{t}"] = getattr(np, t)(i * 1.25 - 3)
        return out
    if recipe == "images":
        return {
            "pil": _image(i, "L" if i % 2 else "RGB"),
            "jpeg": _image(i),
            "png": _image(i),
            "lpil": [_image(i), _image(i + 1, "L")],
            "ljpeg": [_image(i)],
            "lpng": [_image(i), _image(i + 2)],
            "ja": [_jpeg_bytes(i), _jpeg_bytes(i + 1)],
        }
    if recipe == "pkl":
        return {"p": {"i": i, "set": {1, 2}, "t": (i, "x")}, "id": i}
    if recipe == "tokens":
        n = 1 + (i * 37) % (300 if i % 10 == 0 else 50)
        return {"tokens": (np.arange(n, dtype=np.uint32) * (i + 3)) % 50_000}
    if recipe in ("text", "xsv", "mdstext"):
        return {"id": i, "txt": f"row {i} é", "score": i / 4}
    if recipe == "benchtext":  # about 1 KB of text per sample
        words = ("the", "model", "token", "data", "café", "shard", "loss", "batch", "Ωmega")
        text = " ".join(words[(i * 7 + k * k) % len(words)] for k in range(120 + i % 80))
        return {"id": i, "text": text, "meta": {"src": "bench", "n": i % 13}}
    if recipe == "benchtokens":  # 128-383 tokens
        n = 128 + (i * 7919) % 256
        return {
            "tokens": ((np.arange(n, dtype=np.uint32) * 2654435761 + i) % 50_257).astype(np.uint32)
        }
    raise ValueError(recipe)


def samples(recipe: str, n: int) -> list[dict[str, Any]]:
    return [sample(recipe, i) for i in range(n)]


def canonical(value: Any) -> Any:
    """A plain, exactly comparable form of a decoded value (types included)."""
    try:
        from PIL import Image

        if isinstance(value, Image.Image):
            return ("image", value.mode, value.size, value.tobytes())
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.tobytes())
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, set):
        return ("set", sorted(value))
    if isinstance(value, tuple):
        return ("tuple", [canonical(v) for v in value])
    if isinstance(value, (str, bytes, bool, int, float)) or value is None:
        return (type(value).__name__, value)
    raise TypeError(f"cannot canonicalise {type(value)}")


# ---- running the streaming helper (from the lmdata tests and benchmarks) ------------------


def streaming_python() -> str | None:
    """The interpreter of the venv that has mosaicml-streaming, or None when absent."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    exe = os.path.join(root, ".venv", "extra-streaming", "bin", "python")
    return exe if os.path.exists(exe) else None


def run_streaming(job: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    import json
    import os
    import subprocess

    exe = streaming_python()
    if exe is None:
        raise RuntimeError("no .venv/extra-streaming; run make install")
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mds_streaming_helper.py")
    proc = subprocess.run(
        [exe, helper, json.dumps(job)], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"streaming helper failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
