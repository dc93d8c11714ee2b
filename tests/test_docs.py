"""The documentation: the site builds with `mkdocs build --strict` (offline, no warning), the
README stays a door of at most 400 lines with `make demo` / `make test` at the top, every public
verb has a reference page, every `lmdata VERB --option` the README and the docs quote is an
option the CLI has, and every bench module has the docs block `make bench` writes its tables to."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

import lmdata
from lmdata.cli.main import COMMANDS, cli
from lmdata.cli.not_provided import NOT_PROVIDED

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md"))


def test_the_site_builds_strict_and_offline(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs / mkdocs-material not installed (`make install` installs them)")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "WARNING" not in out, out[-4000:]
    # every page of docs/ was built (omitted_files: warn catches a page missing from the nav)
    built = {p.relative_to(site).with_suffix(".md").as_posix() for p in site.rglob("*.html")}
    assert {p.relative_to(DOCS).as_posix() for p in PAGES} <= built
    home = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in home and "fonts.gstatic.com" not in home
    # the generated parts are there: a docstring and a --help
    tokenize = (site / "reference" / "tokenize.html").read_text()
    assert "Usage: lmdata tokenize" in tokenize and "validation_fraction" in tokenize


def test_the_readme_is_a_door():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; move detail into docs/"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Set-up"  # set-up first: CI runs `make test` from it
    setup = text.split("## Set-up\n", 1)[1].split("\n## ", 1)[0]
    block = setup.split("```sh\n", 1)[1].split("```", 1)[0]
    assert block.splitlines()[0].startswith("make demo")
    assert block.splitlines()[1].startswith("make test")
    # its links into the docs (which mkdocs does not see) reach a page and a heading there
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([\w-]+))?\)", text)
    assert len(links) >= 10
    for target, anchor in links:
        page = ROOT / target
        assert page.is_file(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(page), f"README.md links to {target}#{anchor}: no heading"
    # no engineering log in user docs: history lives in git
    for path in [README, *PAGES]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"\bsession \d|\bsessions? [0-9]+-|\(was [0-9.]+x", line), (
                f"{path.relative_to(ROOT)}:{n}: history in user docs: {line.strip()}"
            )


def _anchors(page: Path) -> set[str]:
    """The ids the site gives the headings of ``page`` (Python-Markdown's toc slugs)."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M):
        plain = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        found.add(re.sub(r"[-\s]+", "-", plain))
    return found


def _reference_text() -> str:
    return "\n".join(p.read_text() for p in sorted((DOCS / "reference").glob("*.md")))


def test_every_public_verb_has_a_page():
    text = _reference_text()
    names = [n for n in lmdata.__all__ if not n.startswith("_") and n != "LmdataError"]
    for name in names:  # the docstring, rendered by mkdocstrings
        assert re.search(rf"^::: lmdata\.{name}$|^      heading: lmdata\.{name}$", text, re.M), (
            f"lmdata.{name} has no page under docs/reference/"
        )
    for verb in COMMANDS:  # the --help, rendered by docs/hooks/cli_help.py
        assert re.search(rf"^<!-- cli: {verb}( [a-z_ ]+)? -->$", text, re.M), (
            f"`lmdata {verb}` has no page under docs/reference/"
        )


def test_every_bench_module_has_its_block_on_a_docs_page():
    """`make bench` writes a module's own tables into the block named after it (bench/run.py):
    a module without one would measure for nobody; side-by-side modules fill their tables'."""
    pages = "\n".join(p.read_text() for p in PAGES)
    modules = sorted((ROOT / "bench").glob("bench_*.py"))
    assert len(modules) > 10
    for module in modules:
        if "print_table(" in module.read_text():  # side-by-side tables, blocks by table name
            continue
        name = module.stem
        assert f"\n<!-- bench:{name} -->\n" in pages, f"no docs block for bench/{name}.py"
        assert f"\n<!-- /bench:{name} -->\n" in pages, f"docs block bench:{name} never ends"
    assert "<!-- bench:summary -->" in README.read_text()


# `lmdata` then its global options, the verb and the rest of the command, in code
_COMMAND = re.compile(r"(?<![\w./-])lmdata((?: -c \S+)?) ([a-z_]+)((?:[ \\\n]+[^\s`]+)*)")


def _code(text: str) -> list[str]:
    """The commands of a markdown text: shell blocks and inline spans (which may wrap lines);
    not the generated benchmark blocks, which quote programs' output."""
    text = re.sub(r"^<!-- bench:([\w-]+) -->$.*?^<!-- /bench:\1 -->$", "", text, flags=re.M | re.S)
    blocks = re.findall(r"^```([a-z]*)\n(.*?)^```", text, re.M | re.S)
    fenced = [code for lang, code in blocks if lang in ("", "sh", "bash", "console")]
    rest = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`([^`]+)`", rest)
    return [line for block in fenced for line in block.splitlines()] + spans


def _options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}


def test_commands_quoted_in_the_docs_have_those_options():
    ctx = click.Context(cli)
    checked = 0
    for path in [README, *PAGES]:
        for code in _code(path.read_text()):
            for m in _COMMAND.finditer(code):
                verb, words = m.group(2), m.group(3).replace("\\\n", " ").split()
                where = f"{path.relative_to(ROOT)}: `{m.group(0).strip()}`"
                if verb in NOT_PROVIDED:  # dolma verbs lmdata answers with an error
                    continue
                command = cli.get_command(ctx, verb)
                assert command is not None, f"{where}: no verb {verb!r}"
                while isinstance(command, click.Group) and words and words[0] in command.commands:
                    command = command.commands[words.pop(0)]
                dolma = verb in ("tag", "dedupe", "mix")  # every config key is a dotted option
                known = _options(command)
                for word in words:
                    option = word.strip("[]()|,;").split("=")[0]
                    if not option.startswith("-") or option in ("-", "--") or option[1:2].isdigit():
                        continue
                    if dolma and "." in option:
                        continue
                    assert option in known, f"{where}: `lmdata {verb}` has no {option}"
                    checked += 1
    assert checked > 40  # the check found the commands it is meant to check
