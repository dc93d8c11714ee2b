"""Training-side access: the Loader, row layouts, mixtures and stateless shuffling."""

from __future__ import annotations

from lmdata.loader.loader import Loader, LoaderConfig
from lmdata.loader.shuffle import Permutation

__all__ = ["Loader", "LoaderConfig", "Permutation"]
