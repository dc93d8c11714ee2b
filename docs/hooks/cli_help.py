"""mkdocs hook: a line ``<!-- cli: VERB [SUB ...] -->`` in a page becomes that command's help,
as ``lmdata VERB --help`` prints it (click, run in this process), so the CLI reference is
generated from the commands themselves and cannot drift from them. A command that does not
exist is a warning, which ``mkdocs build --strict`` turns into a failed build."""

from __future__ import annotations

import logging
import re
from typing import Any

MARK = re.compile(r"^<!-- cli: ([a-z_][a-z_ -]*?) -->$", re.M)
WIDTH = 100
log = logging.getLogger("mkdocs.hooks.cli_help")


def command_help(words: list[str]) -> str | None:
    """``lmdata WORDS --help`` as the terminal shows it, or None when the command is unknown."""
    from click.testing import CliRunner

    from lmdata.cli.main import cli

    result = CliRunner().invoke(
        cli,
        [*words, "--help"],
        prog_name="lmdata",
        terminal_width=WIDTH,
        max_content_width=WIDTH,
    )
    if result.exit_code != 0 or not result.output.startswith("Usage: "):
        return None
    return result.output.rstrip()


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def replace(m: re.Match[str]) -> str:
        words = m.group(1).split()
        text = command_help(words)
        if text is None:
            log.warning("%s: no command `lmdata %s`", page.file.src_uri, " ".join(words))
            return m.group(0)
        return f"```text\n{text}\n```"

    return MARK.sub(replace, markdown)
