"""Drop-ins for the origin tools: their class names, signatures and defaults, backed by lmdata.

Change one import and keep the rest of the code:

- ``from lmdata.compat.streaming import MDSWriter, StreamingDataset`` (mosaicml-streaming);
- ``from lmdata.compat.atlas import AtlasDataset, AtlasDatasetWriter`` (torch-atlas-ds);
- ``from lmdata.compat.seqax import Writer, Config`` (seqax ``tools/flat_tokens.py``).

Each module documents where it is stricter than the origin (pickles that would run code are
refused, outputs appear only when complete); everything else behaves as the origin does, down
to the bytes written.
"""

from __future__ import annotations

__all__: list[str] = []
