"""Secrets kept out of what lmdata prints, logs and records.

Everything that shows a URL, a command line or storage options to a person or writes it into a
dataset goes through here: userinfo in URLs (``s3://KEY:SECRET@bucket``), signed-URL query
parameters, and option values whose name says they hold a credential are replaced by
:data:`MASK`. The rule is by name, not by value: a key named ``secret`` is hidden whatever it
holds, so nothing depends on guessing what a secret looks like.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"

# option names (any case; words split on ``_``, ``-`` and ``.``) that hold credentials: a name
# with one of these words, or one of the compound names, or containing one of the run-ins
_SECRET_WORDS = frozenset(
    "secret password passwd pwd token credential credentials signature sig cookie bearer "
    "authorization auth sas apikey passphrase".split()
)
_SECRET_NAMES = frozenset(
    "key key_id access_key access_key_id secret_key api_key account_key private_key "
    "client_secret".split()
)
_SECRET_RUNS = ("accesskey", "secretkey", "apikey", "privatekey", "accountkey", "sessiontoken")
_WORD_SPLIT = re.compile(r"[_\-.\s]+")

# scheme://userinfo@ : up to the first '@'; a '/' is allowed in it only after a ':' (a secret
# with a slash, as AWS secrets have, typed unencoded), so s3://bucket/a@b keeps its path
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@'\":]*:[^\s@'\"]*|[^/\s@'\"]+)@"
)
# ?name=value / &name=value query parameters
_QUERY = re.compile(r"(?P<sep>[?&;])(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^&#\s'\"]*)")


def is_secret_name(name: str) -> bool:
    """Whether an option or parameter called ``name`` may hold a credential."""
    low = str(name).lower().strip("-")
    words = [w for w in _WORD_SPLIT.split(low) if w]
    if "_".join(words) in _SECRET_NAMES or any(w in _SECRET_WORDS for w in words):
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
    name, eq, _ = pair.partition("=")
    if eq and is_secret_name(name.split(".")[-1]):
        return f"{name}={MASK}"
    return redact(pair)
