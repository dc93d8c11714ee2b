"""Options and output helpers shared by the CLI verbs."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click
import orjson

if TYPE_CHECKING:
    from lmdata.parallel.staging import Staging


class FormatName(click.ParamType):
    """A format name or alias; a misspelt one is refused with the closest name suggested.

    ``which`` narrows the choice (for example to the formats tokenize can write); the names
    come from the registry, so the CLI never lists formats itself.
    """

    name = "format"

    def __init__(self, which: Callable[[], list[str]] | None = None) -> None:
        self._which = which

    def choices(self) -> list[str]:
        from lmdata import formats

        return self._which() if self._which else formats.names()

    def get_metavar(self, param: click.Parameter, *args: Any, **kwargs: Any) -> str:
        return "[" + "|".join(self.choices()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from lmdata import formats
        from lmdata.errors import FormatError

        try:
            name = formats.canonical(str(value))
        except FormatError:
            self.fail(
                f"unknown format {value!r}{formats.suggest(str(value))} "
                f"(choose from {', '.join(self.choices())})",
                param,
                ctx,
            )
        if name not in self.choices():
            self.fail(f"{name} is not one of {', '.join(self.choices())}", param, ctx)
        return name


format_option = click.option(
    "--format",
    "-f",
    "fmt",
    default=None,
    type=FormatName(),
    help="The dataset's format; detected from the path when omitted.",
)
split_option = click.option(
    "--split",
    default=None,
    metavar="NAME",
    help="Split to read where the format has splits (flat-tokens: train, validation).",
)
text_key_option = click.option(
    "--text-key", default="text", show_default=True, help="Field holding a record's text."
)


def tokenizer_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--tokenizer`` for the verbs that show token ids as text ('bytes' or a local file)."""
    return click.option("--tokenizer", default=None, help=help)


def _reader_options(ctx: click.Context, param: click.Parameter, allow: bool) -> dict[str, Any]:
    return {"allow_unsafe_pickle": True} if allow else {}


unsafe_pickle_option = click.option(
    "--allow-unsafe-pickle",
    "reader_options",
    is_flag=True,
    default=False,
    callback=_reader_options,
    help="Trust pickles in the dataset (runs code they name). Off by default.",
)
"""``--allow-unsafe-pickle``, given to the command as ``reader_options``: the options every
reader takes (``{"allow_unsafe_pickle": True}`` or empty)."""


class DatasetPath(click.ParamType):
    """A local path that must exist, or a URL (``s3://``, ``memory://``, ...) checked by the
    library in its store (click's own Path would call a URL a missing local file)."""

    name = "path"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        import os

        from lmdata.storage import is_url

        value = os.fspath(value)
        if not is_url(value) and not os.path.lexists(value):
            self.fail(f"Path {value!r} does not exist.", param, ctx)
        return str(value)


def _storage_options(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any] | None:
    """``KEY=VALUE`` pairs as fsspec storage options: a dotted key nests
    (``client_kwargs.endpoint_url=...``), a value that parses as JSON is taken as JSON."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx=ctx, param=param)
        try:
            value: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        *path, last = key.split(".")
        node = out
        for k in path:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise click.BadParameter(f"{key!r} nests below a value", ctx=ctx, param=param)
        node[last] = value
    return out or None


storage_option = click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_storage_options,
    help="An fsspec option for URLs (s3://, gs://, ...), repeatable: e.g. "
    "client_kwargs.endpoint_url=http://host:9000, anon=true, profile=NAME. Credentials are "
    "otherwise read where fsspec reads them (environment, config files).",
)


def _ray_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--verbose``: let Ray's own messages through for this command (an environment variable
    the Ray engine reads, restored when the command ends)."""
    from lmdata.parallel.ray import VERBOSE_ENV

    if not value:
        return
    before = os.environ.get(VERBOSE_ENV)
    os.environ[VERBOSE_ENV] = "1"

    def restore() -> None:
        if before is None:
            os.environ.pop(VERBOSE_ENV, None)
        else:
            os.environ[VERBOSE_ENV] = before

    ctx.call_on_close(restore)


def engine_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--engine``, ``--address`` and ``--verbose``: where the work units run (the output is
    the same), and whether Ray may speak."""
    f = click.option(
        "--verbose",
        is_flag=True,
        expose_value=False,
        callback=_ray_verbose,
        help="--engine ray: show Ray's own log lines and warnings (hidden otherwise).",
    )(f)
    f = click.option(
        "--address",
        default=None,
        metavar="ADDR",
        help="--engine ray: the cluster to join (e.g. ray://head:10001 or auto; default: start "
        "a local Ray instance).",
    )(f)
    return click.option(
        "--engine",
        type=click.Choice(["inprocess", "processes", "ray"]),
        default="processes",
        show_default=True,
        help="Where work units run: this process, local worker processes, or a Ray cluster "
        "(pip install 'lmdata[ray]'). The output bytes are the same for every engine. Ray "
        "costs seconds before the first unit runs (starting a local instance took 5-15 s on "
        "a 2-core machine; joining a running cluster with --address is quicker), so it pays "
        "off for jobs of minutes or on several machines; processes starts in under a second.",
    )(f)


def resume_command() -> str:
    """The command line being run, with ``--resume`` (secrets masked): what continues it."""
    import shlex

    from lmdata._provenance import current_command
    from lmdata._redact import redact_argv

    argv = shlex.split(current_command())
    if "--resume" not in argv:
        argv.append("--resume")
    return shlex.join(redact_argv(argv))


@contextlib.contextmanager
def resumable_on_interrupt() -> Iterator[None]:
    """Ctrl-C in a job whose work folder keeps what is done (dedupe, decontaminate): exit 130
    with the command that continues it, as :func:`say_resume` says for tokenize and convert."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"interrupted: continue with: {resume_command()}", err=True)
        sys.exit(130)


def say_resume(e: BaseException, work: Callable[[], Staging]) -> None:
    """After a job stopped by ``e``, where it kept its work folder (``work()``, looked up only
    then) for ``--resume``, say so, with the command that continues it: Ctrl-C exits 130
    saying it, an lmdata error exits 2 under its ``error:`` line; otherwise (nothing kept, bad
    data or options, another exception) it returns and the caller re-raises ``e`` for the
    CLI's usual report."""
    from lmdata.errors import LmdataError
    from lmdata.parallel.staging import resumable

    if not resumable(e):  # bad data or options (a refused --resume among them): say what to fix
        return
    area = work()
    if not area.exists():  # nothing a resume could use
        return
    again = (
        f"no output written; `--resume` continues from {area.where}\n"
        f"continue with: {resume_command()}"
    )
    if isinstance(e, KeyboardInterrupt):
        click.echo(f"interrupted: {again}", err=True)
        sys.exit(130)
    if isinstance(e, LmdataError):
        click.echo(f"error: {e}\n{again}", err=True)
        sys.exit(2)
    click.echo(again, err=True)
