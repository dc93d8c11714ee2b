"""Secrets kept out of what lmdata prints, logs and records.

Everything that shows a URL, a command line or storage options to a person or writes it into a
dataset goes through here: userinfo in URLs (``s3://KEY:SECRET@bucket``), signed-URL query
parameters, and option values whose name says they hold a credential are replaced by
:data:`MASK`. The rule is by name, not by value: a key named ``secret`` is hidden whatever it
holds, so nothing depends on guessing what a secret looks like.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

MASK = "***"

# option names (any case; words split on ``_``, ``-`` and ``.``) that hold credentials: a name
# with one of these words, or ending in one of the last words (``hf_token``, not
# ``token_column``), or one of the compound names, or containing one of the run-ins
_SECRET_WORDS = frozenset("secret password passwd pwd authorization sas apikey passphrase".split())
_SECRET_LAST_WORDS = frozenset(
    "token credential credentials signature sig cookie bearer auth".split()
)
_SECRET_NAMES = frozenset(
    "key key_id access_key access_key_id secret_key api_key account_key private_key "
    "client_secret".split()
)
_SECRET_RUNS = ("accesskey", "secretkey", "apikey", "privatekey", "accountkey", "sessiontoken")
_WORD_SPLIT = re.compile(r"[_\-.\s]+")

# scheme://userinfo@ : a '/' is allowed in it only after a ':' (a secret with a slash, as AWS
# secrets have, typed unencoded), so s3://bucket/a@b keeps its path; after a ':' it runs to the
# '@' that a host follows (no other '@' before the next '/'), as URL parsers split it, so a
# password with an unencoded '@' is masked whole
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<userinfo>[^/\s@'\":]*:[^\s'\"]*?(?=@[^\s@'\"/]*(?:[/\s'\"]|$))|[^/\s@'\"]+)@"
)
# ?name=value / &name=value query parameters
_QUERY = re.compile(r"(?P<sep>[?&;])(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^&#\s'\"]*)")


def is_secret_name(name: str) -> bool:
    """Whether an option or parameter called ``name`` may hold a credential."""
    low = str(name).lower().strip("-")
    words = [w for w in _WORD_SPLIT.split(low) if w]
    if "_".join(words) in _SECRET_NAMES or any(w in _SECRET_WORDS for w in words):
        return True
    if words and words[-1] in _SECRET_LAST_WORDS:
        return True
    return any(r in low.replace("_", "").replace("-", "") for r in _SECRET_RUNS)


def _query(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")):
        return m.group(0)
    return f"{m.group('sep')}{m.group('name')}={MASK}"


def redact(text: str) -> str:
    """``text`` with the userinfo of every URL in it and secret query values masked; the rest
    (scheme, host, bucket, path) stays so the message still says where."""
    if not isinstance(text, str):
        return text
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    if "=" in text and ("?" in text or "&" in text or ";" in text):
        text = _QUERY.sub(_query, text)
    return text


def redact_options(options: Any) -> Any:
    """A copy of storage options (nested dicts and lists too) with the values of secret-named
    keys masked and URLs in the other values redacted."""
    if isinstance(options, Mapping):
        return {
            k: (MASK if is_secret_name(str(k)) and v not in (None, "") else redact_options(v))
            for k, v in options.items()
        }
    if isinstance(options, (list, tuple)):
        return type(options)(redact_options(v) for v in options)
    if isinstance(options, str):
        return redact(options)
    return options


# command-line options whose value is NAME=VALUE (storage options) or a secret itself
_KV_FLAGS = ("--storage-option", "--option", "-o")


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with secrets masked: URLs' userinfo, ``--storage-option NAME=VALUE``
    values whose NAME is secret-like, ``--token VALUE``-style flags, and ``NAME=VALUE``
    arguments with a secret-like NAME."""
    out: list[str] = []
    argv = [str(a) for a in argv]
    i = 0
    while i < len(argv):
        a = argv[i]
        flag, eq, inline = a.partition("=") if a.startswith("--") else (a, "", "")
        if flag in _KV_FLAGS and not eq and i + 1 < len(argv):
            out.extend([a, _redact_pair(argv[i + 1])])
            i += 2
            continue
        if flag in _KV_FLAGS and eq:
            out.append(f"{flag}={_redact_pair(inline)}")
        elif flag.startswith("--") and is_secret_name(flag[2:]):
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(a)
                if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    out.append(MASK)
                    i += 1
        elif not a.startswith("-") and "=" in a and "://" not in a.split("=", 1)[0]:
            out.append(_redact_pair(a))
        else:
            out.append(redact(a))
        i += 1
    return out


def _redact_pair(pair: str) -> str:
    name, eq, value = pair.partition("=")
    if eq and is_secret_name(name.split(".")[-1]):
        return f"{name}={MASK}"
    if eq and value[:1] in ("{", "["):  # a JSON value (``client_kwargs={"...": ...}``)
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
        else:
            hidden = redact_options(parsed)
            if hidden != parsed:
                return f"{name}={orjson.dumps(hidden).decode()}"
    return redact(pair)


MIN_ENV_SECRET = 8  # shorter values of secret-named variables are not looked for (too common)
_ENV_NOT_SECRET = frozenset({"PWD", "OLDPWD"})  # "pwd" is a password only in option names


def redact_environment(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with the value of every secret-named environment variable masked wherever it
    appears (``--storage-option endpoint_url=http://h/$TOKEN`` expanded by the shell)."""
    env = os.environ if environ is None else environ
    values = {
        v
        for k, v in env.items()
        if len(v) >= MIN_ENV_SECRET and k not in _ENV_NOT_SECRET and is_secret_name(k)
    }
    for v in sorted(values, key=len, reverse=True):  # a value inside a longer one goes first
        if v in text:
            text = text.replace(v, MASK)
    return text


def redact_command(command: str | Iterable[str]) -> str:
    """A command line fit to record or show: an argument list (``["lmdata", ...]``) joined
    after :func:`redact_argv`; a text split as a shell would, masked the same way, or (when it
    is not shell syntax, such as the description of a Python call) given to :func:`redact`.
    Values of secret-named environment variables are masked in both."""
    if not isinstance(command, str):
        return redact_environment(shlex.join(redact_argv(command)))
    try:
        argv = shlex.split(command)
    except ValueError:  # unbalanced quotes: not a command line
        argv = []
    if argv and shlex.join(argv) == command:  # a command line as lmdata records one
        return redact_environment(shlex.join(redact_argv(argv)))
    return redact_environment(redact(command))


def redact_record(obj: Any) -> Any:
    """A copy of a JSON record lmdata keeps in a work folder (a job's manifest) with URLs'
    secrets masked in every string and ``storage_options`` masked by :func:`redact_options`;
    its other keys are data, kept whatever their name (dedupe's ``key``, ``token_column``), so
    a resume still sees every change but a credential's."""
    if isinstance(obj, Mapping):
        return {
            k: redact_options(v) if k == "storage_options" else redact_record(v)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_record(v) for v in obj)
    if isinstance(obj, str):
        return redact(obj)
    return obj
