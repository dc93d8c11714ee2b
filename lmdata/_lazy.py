"""Public names that load on first use, for ``lmdata`` and the format packages.

``import lmdata`` and loading a format's spec stay fast because the modules behind their public
names (readers, writers, validators, the tokenizer) are imported when a name is first read.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

# package name -> {public name: module that defines it}
_EXPORTS: dict[str, Mapping[str, str]] = {}


class _LazyPackage(types.ModuleType):
    """A package with lazily loaded names, some named like its submodules (``lmdata.tokenize``
    the function and ``lmdata.tokenize`` the package; a format's ``validate`` verb and its
    ``validate`` module): importing such a submodule does not rebind the name to the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            # the import system binding pkg.<name> to a submodule just loaded
            if name in _EXPORTS.get(self.__name__, ()) or callable(self.__dict__.get(name)):
                return  # keep the public name (or let __getattr__ load it)
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        own = self.__dict__.get("__dir__")  # a package's own answer (lmdata: its __all__)
        if callable(own):
            return list(own())
        return sorted(set(self.__dict__) | set(_EXPORTS.get(self.__name__, ())))


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` (assign it there) that imports
    ``exports[name]`` (a module path) on the first read of ``name``.

    It also makes ``dir(package)`` list the exported names, and keeps any public name (an
    export, or a callable the package defines) from being replaced by a same-named submodule
    when that submodule is imported.
    """
    module = sys.modules[package]
    _EXPORTS[package] = dict(exports)
    module.__class__ = _LazyPackage

    def __getattr__(name: str) -> Any:
        modname = _EXPORTS[package].get(name)
        if modname is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(modname), name)
        setattr(module, name, value)  # later lookups skip this function
        return value

    return __getattr__
