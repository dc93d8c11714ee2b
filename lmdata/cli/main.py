"""The ``lmdata`` command: a group whose verbs live in one module each, imported on use."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

import click

from lmdata.errors import LmdataError

# verb -> module defining a click command named `command`
COMMANDS: dict[str, str] = {
    "info": "lmdata.cli.info",
    "validate": "lmdata.cli.validate",
    "cat": "lmdata.cli.cat",
    "stats": "lmdata.cli.stats",
    "view": "lmdata.cli.view",
    "demo": "lmdata.cli.demo",
    "tokenize": "lmdata.cli.tokenize",
    "convert": "lmdata.cli.convert",
    "merge": "lmdata.cli.merge",
    "index": "lmdata.cli.index",
    "tag": "lmdata.cli.tag",
    "dedupe": "lmdata.cli.dedupe",
    "mix": "lmdata.cli.mix",
    "decontaminate": "lmdata.cli.decontaminate",
    "list": "lmdata.cli.list_taggers",
    "modalities": "lmdata.cli.modalities",
    "clean": "lmdata.cli.clean",
    "manifest": "lmdata.cli.manifest",
    "explain": "lmdata.cli.explain",
}
# the one-line summaries `lmdata --help` lists, so listing the verbs imports none of them
SUMMARIES: dict[str, str] = {
    "info": "Show a dataset's format, counts, codecs, size and provenance.",
    "validate": "Check a dataset against its format's rules.",
    "cat": "Print records as JSON lines (--decode: token ids as text).",
    "stats": "Counts, length distribution, frequent tokens; plots and HTML.",
    "view": "Serve a read-only page over a dataset on 127.0.0.1.",
    "demo": "The main job end to end on an embedded corpus.",
    "tokenize": "Tokenize documents into a token dataset.",
    "convert": "Convert a dataset into another format, losslessly.",
    "merge": "Merge datasets (MDS partitions, .pbin files, Atlas) into one.",
    "index": "Index the lines of a JSONL file for O(1) random access.",
    "tag": "Tag documents (dolma tag): attributes mirroring documents.",
    "dedupe": "Flag copies and near-copies, first kept (dolma dedupe).",
    "mix": "Mix documents with filters and attributes (dolma mix).",
    "decontaminate": "Flag spans of documents that match evaluation text.",
    "list": "List the taggers `lmdata tag` accepts (dolma list).",
    "modalities": "Modalities' command lines (`lmdata modalities data ...`).",
    "clean": "Remove what killed writers left behind (staging, claims).",
    "manifest": "Write a dataset's integrity manifest, or --check one.",
    "explain": "Show the documents in every row of a Loader batch (lineage).",
}
# verbs that read a dolma config given before the verb (`lmdata -c config.yaml mix`)
CONFIG_VERBS = ("tag", "dedupe", "mix")


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, m in COMMANDS.items() if importlib.util.find_spec(m) is not None)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The verb list from :data:`SUMMARIES`: `lmdata --help` stays fast (no verb import)."""
        names = self.list_commands(ctx)
        if names:
            with formatter.section("Commands"):
                formatter.write_dl([(n, SUMMARIES.get(n, "")) for n in names])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        mod = COMMANDS.get(name)
        if mod is None:  # an origin tool's verb lmdata lacks says what to use instead
            from lmdata.cli.not_provided import command_for

            return command_for(name)
        if importlib.util.find_spec(mod) is None:
            return None
        return importlib.import_module(mod).command

    def main(self, args: Any = None, prog_name: str | None = None, **kwargs: Any) -> Any:
        """Run the command line, recorded as the command that made what it writes."""
        from lmdata._provenance import command_scope

        argv = sys.argv[1:] if args is None else list(args)
        with command_scope(["lmdata", *argv]):  # recorded with its secrets masked
            return super().main(args=args, prog_name=prog_name, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LmdataError as e:
            _fail(str(e))
        except KeyboardInterrupt:
            click.echo("interrupted; no partial output was left behind", err=True)
            sys.exit(130)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as e:
            if os.environ.get("LMDATA_DEBUG"):
                raise
            from lmdata.storage._errors import from_store, translate

            if from_store(e):  # a store failure that escaped unwrapped
                known = translate(e, None)
                if isinstance(known, LmdataError):
                    _fail(str(known))
            _fail(
                f"unexpected {type(e).__name__}: {e} (a bug in lmdata: please report it; "
                "LMDATA_DEBUG=1 shows the traceback)"
            )


def _fail(message: str) -> None:
    """Print ``message`` as one ``error:`` line on stderr (secrets masked), exit status 2. A
    progress line left open on the terminal is ended first, so the error starts a line."""
    from lmdata._redact import redact

    text = " ".join(redact(message).split())
    click.echo(f"\nerror: {text}" if _progress_open() else f"error: {text}", err=True)
    sys.exit(2)


def _progress_open() -> bool:
    """Whether a progress bar still holds the terminal's current line."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover (tqdm is a core dependency)
        return False
    return any(not getattr(bar, "disable", True) for bar in list(getattr(tqdm, "_instances", ())))


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lmdata")
@click.option(
    "-c",
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A dolma config for tag, dedupe or mix, given before the verb as dolma takes it "
    "(`lmdata -c mix.yaml mix`).",
)
@click.pass_context
def cli(ctx: click.Context, config: str | None) -> None:
    """Read, write, validate and convert language-model training data.

    Formats: flat-tokens (seqax), atlas, dolma, modalities (.pbin and raw JSONL),
    mds / mds-csv / mds-tsv / mds-jsonl (MosaicML streaming). Run `lmdata VERB --help`.
    Drop-in command lines: `lmdata tag/dedupe/mix/list` take dolma's, `lmdata modalities
    data ...` takes modalities'.
    """
    if config is not None and ctx.invoked_subcommand not in CONFIG_VERBS:
        from lmdata.cli.not_provided import NOT_PROVIDED

        if ctx.invoked_subcommand not in NOT_PROVIDED:  # those: their own error says more
            raise click.UsageError(
                f"-c CONFIG before the verb is for {', '.join(CONFIG_VERBS)}; "
                f"`{ctx.invoked_subcommand}` does not read a dolma config"
            )
    ctx.obj = {"config": config}


def main() -> None:
    cli(prog_name="lmdata")
