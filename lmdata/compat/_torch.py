"""Classes that subclass a torch dataset type when torch is installed, built on first use.

The origin tools' datasets are torch ``Dataset``/``IterableDataset`` subclasses, so code may
check ``isinstance``; importing torch is slow and optional, so a drop-in module builds such a
class only when it is first asked for (module ``__getattr__``), and without torch the class
is the plain implementation.
"""

from __future__ import annotations

from typing import Any

_BUILT: dict[tuple[str, str], type] = {}


def torch_class(module: str, name: str, impl: type, torch_base: str) -> type:
    """``impl`` renamed ``module.name``, also deriving from ``torch.utils.data.<torch_base>``
    when torch imports. The same class object is returned on every call (pickle needs it)."""
    key = (module, name)
    cls = _BUILT.get(key)
    if cls is None:
        bases: tuple[type, ...] = (impl,)
        try:
            import torch.utils.data as tud

            bases = (impl, getattr(tud, torch_base))
        except ImportError:
            pass
        ns: dict[str, Any] = {"__module__": module, "__doc__": impl.__doc__, "__qualname__": name}
        cls = _BUILT[key] = type(name, bases, ns)
    return cls
