"""Optional dependencies: which pip extra brings each one, and importing them with that hint.

``import lmdata`` never imports these. Code that needs one calls :func:`require`, which
returns the module or raises :class:`~lmdata.errors.MissingDependencyError` naming the extra
(``pip install 'lmdata[torch]'``); every extra here is declared in ``pyproject.toml``, and
``lmdata[all]`` installs them all.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lmdata.errors import MissingDependencyError

# top-level module -> (pip extra of lmdata, pip package that provides the module)
EXTRAS: dict[str, tuple[str, str]] = {
    "zarr": ("zarr", "zarr"),
    "google_crc32c": ("crc32c", "google-crc32c"),
    "torch": ("torch", "torch"),
    "torchdata": ("torch", "torchdata"),  # StatefulDataLoader, in the caller's code only
    "ray": ("ray", "ray"),
    "s3fs": ("s3", "s3fs"),
    "gcsfs": ("gcs", "gcsfs"),
    "matplotlib": ("plot", "matplotlib"),
    "jq": ("jq", "jq"),
    "gigatoken": ("fast", "gigatoken"),
}


def install_hint(module: str) -> str:
    """The pip command that installs ``module`` (an lmdata extra when there is one)."""
    top = module.split(".")[0]
    if top in EXTRAS:
        return f"pip install 'lmdata[{EXTRAS[top][0]}]'"
    return f"pip install {top.replace('_', '-')}"


def missing(module: str, needed_for: str) -> MissingDependencyError:
    """The error for ``module`` not being installed, saying what needs it and how to fix it."""
    top = module.split(".")[0]
    package = EXTRAS[top][1] if top in EXTRAS else top
    return MissingDependencyError(
        f"{needed_for} needs the package {package!r}, which is not installed: {install_hint(top)}"
    )


def require(module: str, needed_for: str) -> ModuleType:
    """``import module``, or MissingDependencyError naming the extra that installs it.

    ``needed_for`` says what the caller is doing ("reading a sharded zarr v3 array").
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        # a dependency of the optional package missing is the same fix: reinstall the extra
        raise missing(e.name or module, needed_for) from None
