"""The execution seam's contract as the code states it: every function a pipeline runs on an
executor takes a frozen dataclass and returns one (or a count), and no module outside
``lmdata/parallel/`` starts processes of its own."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from pathlib import Path

import lmdata

ROOT = Path(lmdata.__file__).parent

# (module, function run on an executor's workers)
UNIT_FUNCTIONS = [
    ("lmdata.tokenize.pipeline", "_process"),
    ("lmdata.convert", "_read_block"),
    ("lmdata.dolma.tag", "_tag_file"),
    ("lmdata.dolma.mixer", "_mix_shard"),
    ("lmdata.dolma.mixer", "_count_lines"),
    ("lmdata.dolma.dedupe", "_phase_hash"),
    ("lmdata.dolma.dedupe", "_phase_mark"),
    ("lmdata.dolma.dedupe", "_phase_write"),
    ("lmdata.dolma.pieces", "run_join"),
    ("lmdata.dolma.dedupe", "run_join_marked"),
    ("lmdata.dolma._minhash_units", "phase_sign"),
    ("lmdata.dolma._minhash_units", "phase_bucket"),
    ("lmdata.dolma._minhash_units", "phase_verify"),
    ("lmdata.dolma._minhash_write", "phase_write"),
    ("lmdata.dolma.decontam", "phase_match"),
]
# convert hands back a block it cannot stage exactly (a set, say) as its records
RECORDS_FALLBACK = {("lmdata.convert", "_read_block")}
EXECUTOR_CALLS = {"run_all", "map_ordered", "run_some"}


def _frozen(t: object) -> bool:
    return dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen  # type: ignore[union-attr]


def _submitted_functions() -> set[str]:
    """Names of the functions passed first to run_all / map_ordered / run_some in lmdata."""
    names = set()
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "parallel":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if called in EXECUTOR_CALLS and isinstance(node.args[0], ast.Name):
                names.add(node.args[0].id)
    return names


def test_every_function_run_on_an_executor_is_listed_here() -> None:
    # a new pipeline step must come with typed units (add it to UNIT_FUNCTIONS)
    assert _submitted_functions() <= {f for _, f in UNIT_FUNCTIONS} | {"fn"}


def test_units_and_results_are_frozen_dataclasses() -> None:
    for module, name in UNIT_FUNCTIONS:
        hints = typing.get_type_hints(getattr(importlib.import_module(module), name))
        ret = hints.pop("return")
        (unit,) = hints.values()
        assert _frozen(unit), (module, name, unit)
        results = typing.get_args(ret) or (ret,)
        if (module, name) in RECORDS_FALLBACK:
            results = tuple(r for r in results if typing.get_origin(r) is not list)
        assert all(r is int or _frozen(r) for r in results), (module, name, ret)


def test_no_module_outside_parallel_starts_processes() -> None:
    found = []
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "parallel":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if any(
                m.startswith("multiprocessing") or m.endswith("ProcessPoolExecutor") for m in mods
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"process pools outside lmdata/parallel: {found}"
