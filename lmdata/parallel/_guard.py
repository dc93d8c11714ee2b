"""Refuse to spawn workers for a script that would run again in each of them.

A worker started by *spawn* or *forkserver* (the local engine's choice once this process runs
other threads, after ``ray.init()`` say) imports the main script as ``__mp_main__``, which runs
its top level again: a script without ``if __name__ == "__main__":`` starts its whole job again
in every worker (nested ``ray.init``s, multiprocessing's "bootstrapping phase" RuntimeError,
staged parts removed under the driver). This is found before any worker starts, from the line
of the script that is running, and named in one line with the fix.
"""

from __future__ import annotations

import ast
import functools
import linecache
import multiprocessing as mp
import os
import sys
import threading
from types import FrameType, ModuleType

from lmdata.errors import InvalidInputError

GUARD = 'if __name__ == "__main__":'


def _reruns_main(main: ModuleType) -> bool:
    """Whether a spawned worker runs ``main`` again (multiprocessing's own rule: a module run
    with -m or a script, unless it is a package's ``__main__`` or IPython's launcher)."""
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return name != "__main__" and not name.endswith(".__main__")
    path = getattr(main, "__file__", None)
    return isinstance(path, str) and os.path.splitext(os.path.basename(path))[0] != "ipython"


def _top_level(main: ModuleType) -> FrameType | None:
    """The frame running ``main``'s top level on the main thread (None when none is: the call
    comes from elsewhere, so whatever runs it is not the script's top level)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


@functools.lru_cache(maxsize=8)
def _guarded_lines(filename: str, source: str) -> tuple[tuple[int, int], ...] | None:
    """The line ranges of the bodies of ``if __name__ == "__main__":`` in ``source`` (None if
    it does not parse: then nothing is claimed)."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return None
    return tuple(
        (node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_main_test(node.test)
    )


def unguarded_line(main: ModuleType | None = None) -> tuple[str, int] | None:
    """(file, line) of the script's top-level line that is running, when a spawned worker
    would run it again (it is outside every ``if __name__ == "__main__":``); else None (an
    interactive session, a guarded script, or a source that cannot be read)."""
    main = main if main is not None else sys.modules.get("__main__")
    if main is None or not _reruns_main(main):
        return None
    frame = _top_level(main)
    if frame is None:
        return None
    filename, line = frame.f_code.co_filename, frame.f_lineno or 0
    source = "".join(linecache.getlines(filename, frame.f_globals))
    if not source:
        return None  # nothing to judge by: never refuse on a guess
    ranges = _guarded_lines(filename, source)
    if ranges is None or any(lo <= line <= hi for lo, hi in ranges):
        return None
    return filename, line


def _message(where: str, method: str) -> str:
    return (
        f"{where} starts lmdata's worker processes from the script's top level, and workers "
        f"started by {method} (the local engine's choice once this process runs other "
        "threads, after ray.init() say) import the script again and run it: put the script's "
        f"code under `{GUARD}` (or pass engine='inprocess')"
    )


def check(method: str) -> None:
    """Before starting workers by ``method``: fail at once if they would run the script's
    top level again (see the module docstring)."""
    if method == "fork":
        return
    found = unguarded_line()
    if found is not None:
        raise InvalidInputError(_message(f"{found[0]}:{found[1]}", method))


def check_not_bootstrapping() -> None:
    """In a spawned worker that is still importing the main script (its unguarded top level
    is asking for workers of its own): fail at once, saying so, instead of starting the
    script's job again inside the worker."""
    if getattr(mp.process.current_process(), "_inheriting", False):
        main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
        where = getattr(main, "__file__", None) or "the main script"
        raise InvalidInputError(_message(str(where), "spawn"))
