"""What the ``tag``, ``dedupe`` and ``mix`` verbs share: ``-c`` config files with dotted
``--set key=value`` overrides (values parsed as YAML, so ``--set processes=2`` is a number),
and dolma's own command-line forms, so that a dolma command line runs with ``lmdata`` in
place of ``dolma``:

- lists as space-separated values (``--taggers a b c``, ``--documents x y``), as well as
  lmdata's repeated options (``-t a -t b``);
- dolma's spellings: every config key as a dotted option (``--dedupe.skip_empty``,
  ``--work_dir.output DIR``, ``--bloom_filter.read_only``), booleans as ``--x``/``--no-x``,
  ``--key=value``;
- ``-c CONFIG`` before the verb (``lmdata -c config.yaml mix``) or after it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import click
import yaml

from lmdata.dolma.config import apply_overrides, load_config, load_yaml
from lmdata.errors import InvalidInputError

DOLMA_VERBS = ("tag", "dedupe", "mix", "list")
_KEY = re.compile(r"--([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*)\Z")
_NUMBER = re.compile(r"-\d")


def parse_sets(items: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InvalidInputError(f"--set {item!r}: write KEY=VALUE, e.g. dedupe.name=dups")
        out[key.strip()] = load_yaml(value) if value else ""
    return out


def build(config: str | None, flags: dict[str, Any], sets: tuple[str, ...]) -> dict[str, Any]:
    """The config file (if any), then command-line flags, then ``--set`` overrides on top."""
    data = load_config(config) if config else {}
    data = apply_overrides(data, flags)
    return apply_overrides(data, parse_sets(sets))


def config_path(ctx: click.Context, own: str | None) -> str | None:
    """The config file: the verb's ``-c`` or the one given before the verb (not both)."""
    root = ctx.find_root().obj
    before = root.get("config") if isinstance(root, dict) else None
    if own and before:
        raise InvalidInputError("give -c CONFIG once, before or after the verb")
    return own or before


def show_config(data: dict[str, Any]) -> None:
    """``--dryrun``: print the resolved config (as dolma does) and run nothing."""
    click.echo(yaml.safe_dump(data, sort_keys=True, allow_unicode=True).rstrip())


def _is_value(tok: str) -> bool:
    return not tok.startswith("-") or tok == "-" or _NUMBER.match(tok) is not None


def _yaml_value(tok: str) -> str:
    """A dolma option value as the YAML text ``--set`` parses (a string stays a string)."""
    try:
        parsed = load_yaml(tok)
    except yaml.YAMLError:
        parsed = tok
    if isinstance(parsed, (bool, int, float)) or parsed is None:
        return tok
    return json.dumps(
        tok, ensure_ascii=False
    )  # quoted, so '$.x', 'yes' or '1e3x' are never re-interpreted


def dolma_args(command: click.Command, args: list[str]) -> list[str]:
    """Rewrite dolma's argument forms into the ones the click command declares.

    Declared list options take every following value (``--taggers a b``); a declared flag
    ``--x`` has ``--no-x``; any other ``--dotted.key [value ...]`` becomes ``--set
    dotted.key=value`` (no value: true; several: a list), so every config key is an option.
    """
    opts: dict[str, click.Option] = {}
    for p in command.params:
        if isinstance(p, click.Option):
            for name in (*p.opts, *p.secondary_opts):
                opts[name] = p
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            out += args[i - 1 :]
            break
        name, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        values = [inline] if eq else []
        opt = opts.get(name)
        if opt is not None and opt.is_flag:
            out.append(tok)
            continue
        if opt is not None and not opt.multiple:
            out += [tok] if eq or i >= len(args) else [tok, args[i]]
            i += 0 if eq or i >= len(args) else 1
            continue
        if name in ("-h", "--help") or (opt is None and _KEY.match(name) is None):
            out.append(tok)  # click reports what it does not know
            continue
        while i < len(args) and _is_value(args[i]):
            values.append(args[i])
            i += 1
        if opt is not None:  # a list option: one occurrence per value
            for v in values:
                out += [name, v]
            continue
        key = name[2:]
        if key.startswith("no-") and not values:
            out += ["--set", f"{key[3:]}=false"]
        elif not values:
            out += ["--set", f"{key}=true"]
        elif len(values) == 1:
            out += ["--set", f"{key}={_yaml_value(values[0])}"]
        else:
            out += ["--set", f"{key}=[{', '.join(_yaml_value(v) for v in values)}]"]
    return out


class DolmaCommand(click.Command):
    """A click command that also accepts dolma's argument forms (see :func:`dolma_args`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, dolma_args(self, args))
