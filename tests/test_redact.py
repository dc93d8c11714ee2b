"""lmdata._redact: secrets never survive, everything else does."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from lmdata._redact import (
    MASK,
    is_secret_name,
    redact,
    redact_argv,
    redact_command,
    redact_options,
    redact_record,
)

SECRET_CHARS = string.ascii_letters + string.digits + "+/="


@given(
    key=st.text(string.ascii_uppercase + string.digits, min_size=4, max_size=20),
    secret=st.text(SECRET_CHARS, min_size=8, max_size=40),
    scheme=st.sampled_from(["s3", "gs", "http", "https", "ftp", "simplecache::s3"]),
)
def test_userinfo_never_survives_and_the_place_does(key, secret, scheme) -> None:
    url = f"{scheme}://{key}:{secret}@my-bucket/some/path.zarr"
    for text in (url, f"error: {url}: no such object", f"'{url}'"):
        out = redact(text)
        assert secret not in out.replace("my-bucket/some/path.zarr", "")
        assert f"{key}:" not in out
        assert "my-bucket/some/path.zarr" in out
        assert MASK in out


@given(secret=st.text(string.ascii_letters + string.digits + "+=@:", min_size=1, max_size=30))
def test_a_password_with_an_unencoded_at_sign_is_masked_whole(secret) -> None:
    """URL parsers split userinfo at the last '@' before the host: ``http://u:p@ss@host``
    has the password ``p@ss``, of which ``ss`` was shown."""
    secret = f"p{secret}x"
    out = redact(f"endpoint http://user:{secret}@host:9000/x failed")
    assert out == f"endpoint http://{MASK}@host:9000/x failed"
    assert redact(f"s3://KEY:{secret}@bkt/a@b") == f"s3://{MASK}@bkt/a@b"


def test_paths_with_an_at_sign_and_plain_urls_are_kept() -> None:
    for text in ("s3://bucket/a@b.c/d", "s3://bucket/key", "/local/x@y", "memory://x/y"):
        assert redact(text) == text


def test_signed_query_values_are_masked_others_kept() -> None:
    url = "https://h/o?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=deadbeef&partNumber=2"
    out = redact(url)
    assert "deadbeef" not in out and "AKIA" not in out
    assert "partNumber=2" in out


def test_options_mask_secret_names_at_any_depth() -> None:
    opts = {
        "key": "AKIAEXAMPLE",
        "secret": "s3cr3t",
        "token": "tok",
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_secret_access_key": "z"},
        "config_kwargs": [{"password": "pw"}],
    }
    out = redact_options(opts)
    flat = repr(out)
    for secret in ("AKIAEXAMPLE", "s3cr3t", "tok'", "'z'", "'pw'"):
        assert secret not in flat
    assert out["anon"] is False
    assert out["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:9000"
    assert opts["key"] == "AKIAEXAMPLE"  # a copy: the caller's options are untouched


def test_argv_masks_storage_options_tokens_and_urls_only() -> None:
    argv = [
        "lmdata",
        "tokenize",
        "s3://AK:SK@b/in",
        "out.zarr",
        "--storage-option",
        "key=AKIA1",
        "--storage-option=secret=SK2",
        "--storage-option",
        "client_kwargs.endpoint_url=http://127.0.0.1:9",
        "--text-key",
        "text",
        "--hf-token",
        "hf_x",
        "--tokenizer",
        "tok.json",
    ]
    out = redact_argv(argv)
    joined = " ".join(out)
    for secret in ("AK:SK", "AKIA1", "SK2", "hf_x"):
        assert secret not in joined
    for kept in ("--text-key text", "--tokenizer tok.json", "endpoint_url=http://127.0.0.1:9"):
        assert kept in joined
    assert len(out) == len(argv)


def test_names() -> None:
    for name in ("key", "secret", "aws_secret_access_key", "session_token", "password", "token"):
        assert is_secret_name(name), name
    for name in ("text_key", "id_key", "endpoint_url", "anon", "profile", "author", "region"):
        assert not is_secret_name(name), name


def test_json_valued_storage_options_are_masked_inside() -> None:
    argv = ["--storage-option", 'client_kwargs={"aws_secret_access_key": "zz-secret", "r": 1}']
    out = " ".join(redact_argv(argv))
    assert "zz-secret" not in out and '"r":1' in out


def test_names_of_data_are_not_secrets() -> None:
    for name in ("token_column", "token_ids", "max_tokens", "tokenizer", "--token-column"):
        assert not is_secret_name(name), name
    for name in ("hf_token", "--hf-token", "auth_token", "X-Amz-Security-Token", "sas"):
        assert is_secret_name(name), name
    assert redact_argv(["--token-column", "tokens"]) == ["--token-column", "tokens"]


def test_records_mask_storage_options_and_urls_and_keep_data() -> None:
    manifest = {
        "job": {"key": "$.text", "token_column": "tokens", "storage_options": {"secret": "x1"}},
        "inputs": [{"path": "s3://AK:SK@b/in.jsonl", "size": 3}],
    }
    out = redact_record(manifest)
    assert out["job"]["key"] == "$.text" and out["job"]["token_column"] == "tokens"
    assert out["job"]["storage_options"] == {"secret": MASK}
    assert out["inputs"][0] == {"path": f"s3://{MASK}@b/in.jsonl", "size": 3}


def test_commands_as_text_or_arguments(monkeypatch) -> None:
    monkeypatch.setenv("SOME_API_KEY", "value-from-env-42")
    line = "lmdata tokenize in out --storage-option secret=SK1 --text-key body"
    assert redact_command(line) == f"lmdata tokenize in out --storage-option 'secret={MASK}' " + (
        "--text-key body"
    )
    assert redact_command(["x", "--name", "value-from-env-42"]) == f"x --name {MASK}"
    assert redact_command("not 'shell") == "not 'shell"
    monkeypatch.setenv("PWD", "/home/someone/data")  # the working directory is no password
    assert redact_command(["x", "/home/someone/data/in.jsonl"]) == "x /home/someone/data/in.jsonl"
