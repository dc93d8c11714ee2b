"""What the ``tag``, ``dedupe`` and ``mix`` verbs share: ``-c`` config files with dotted
``--set key=value`` overrides (values parsed as YAML, so ``--set processes=2`` is a number)."""

from __future__ import annotations

from typing import Any

import yaml

from lmdata.dolma.config import apply_overrides, load_config
from lmdata.errors import InvalidInputError


def parse_sets(items: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InvalidInputError(f"--set {item!r}: write KEY=VALUE, e.g. dedupe.name=dups")
        out[key.strip()] = yaml.safe_load(value) if value else ""
    return out


def build(config: str | None, flags: dict[str, Any], sets: tuple[str, ...]) -> dict[str, Any]:
    """The config file (if any), then command-line flags, then ``--set`` overrides on top."""
    data = load_config(config) if config else {}
    data = apply_overrides(data, flags)
    return apply_overrides(data, parse_sets(sets))
