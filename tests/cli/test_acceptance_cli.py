"""Acceptance check (house style, issues 12/13/16's CLI options): every option of every verb,
sub-verbs included, has help text."""

from __future__ import annotations

import click

from lmdata.cli.main import COMMANDS, cli


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli)
    out: list[tuple[str, click.Command]] = []

    def walk(name: str, cmd: click.Command) -> None:
        out.append((name, cmd))
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                walk(f"{name} {sub}", cmd.get_command(ctx, sub))

    for name in sorted(COMMANDS):
        walk(name, cli.get_command(ctx, name))
    return out


def test_every_option_of_every_verb_has_help_text():
    commands = _commands()
    assert {"tokenize", "convert", "tag", "dedupe", "mix"} <= {n for n, _ in commands}
    missing = [
        (name, p.opts)
        for name, cmd in commands
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
    ]
    assert not missing, missing
    for name, cmd in commands:
        if name in ("tokenize", "convert", "tag", "dedupe", "mix"):
            opts = {o for p in cmd.params for o in p.opts}
            assert {"--engine", "--address"} <= opts, name
        if name in ("tokenize", "convert", "dedupe"):
            assert "--resume" in {o for p in cmd.params for o in p.opts}, name
