"""The optional C extensions of lmdata/_native/ (the rest of the build is in pyproject.toml):
one per NAME.c there, with the headers it includes, each carrying the digest of those sources
so that lmdata can tell a stale build (lmdata/_native/__init__.py). Without a C compiler none
is built and lmdata runs the same code in Python."""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup

NATIVE = "lmdata/_native"


def _rules():
    """lmdata/_native/_sources.py, loaded by path (lmdata is not installed yet)."""
    spec = importlib.util.spec_from_file_location(
        "lmdata_native_sources", Path(__file__).parent / NATIVE / "_sources.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extensions():
    rules = _rules()
    root = Path(__file__).parent / NATIVE
    out = []
    for name in rules.extensions(root):
        files = rules.sources(name, root)
        out.append(
            Extension(
                f"lmdata._native.{name}",
                sources=[f"{NATIVE}/{name}.c"],
                depends=[f"{NATIVE}/{p.name}" for p in files[1:]],
                define_macros=[("LMDATA_SOURCE_DIGEST", f'"{rules.digest(files)}"')],
                optional=True,  # no compiler: lmdata runs the pure-Python twin
            )
        )
    return out


setup(ext_modules=_extensions())
