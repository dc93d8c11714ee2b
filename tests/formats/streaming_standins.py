"""Stand-ins for the modules mosaicml-streaming imports but never uses for MDS reading and writing.

``import streaming`` imports torchvision (``streaming.vision``) and transformers
(``streaming.base.dataloader``). PyPI's torchvision is built against CUDA torch and fails to
load beside the CPU torch of ``.venv/extra-streaming``, so ``make install`` copies this file
into that venv with a ``.pth`` line that calls :func:`install`: torchvision becomes a stand-in
there (only while no real torchvision is installed), and ``from streaming import
StreamingDataset`` works in that venv as it is. The MDS test helper also replaces
transformers, which is installed but takes seconds to import.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

TORCHVISION = (
    "torchvision",
    "torchvision.datasets",
    "torchvision.transforms",
    "torchvision.transforms.functional",
)
TRANSFORMERS = (
    "transformers",
    "transformers.feature_extraction_utils",
    "transformers.tokenization_utils_base",
    "transformers.models",
    "transformers.models.auto",
    "transformers.models.auto.tokenization_auto",
)


class _Placeholder:
    def __init__(self, *a: object, **k: object) -> None:
        raise RuntimeError(
            "torchvision/transformers are stand-ins in this venv (tests/formats/"
            "streaming_standins.py); streaming's vision and text helpers are unavailable"
        )


def _stub(name: str) -> None:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for attr in (
        "VisionDataset",
        "to_tensor",
        "CIFAR10",
        "BatchFeature",
        "BatchEncoding",
        "AutoTokenizer",
    ):
        setattr(m, attr, _Placeholder)
    sys.modules.setdefault(name, m)


def install(transformers: bool = False) -> None:
    """Register the stand-ins: torchvision unless a real one is installed, and transformers
    too when asked (the real one is slow to import)."""
    names = list(TORCHVISION) if importlib.util.find_spec("torchvision") is None else []
    if transformers:
        names += TRANSFORMERS
    for name in names:
        _stub(name)


def install_into_venv() -> None:
    """Copy this module into the running interpreter's site-packages with a ``.pth`` line
    that calls :func:`install` at start-up (what ``make install`` runs in the venv)."""
    import shutil
    import sysconfig
    from pathlib import Path

    site = Path(sysconfig.get_paths()["purelib"])
    shutil.copy(__file__, site / "lmdata_streaming_standins.py")
    (site / "lmdata_streaming_standins.pth").write_text(
        "import lmdata_streaming_standins; lmdata_streaming_standins.install()\n"
    )


if __name__ == "__main__" and sys.argv[1:] == ["--install-into-venv"]:
    install_into_venv()
