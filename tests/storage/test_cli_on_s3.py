"""``lmdata index`` and ``lmdata merge`` on s3 (the loopback moto server), with the endpoint
given only by ``--storage-option``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import lmdata
from lmdata.cli.main import cli
from lmdata.storage import resolve


@pytest.fixture
def flags(s3_server, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # only the option points s3fs at the server
    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    return ["--storage-option", f"client_kwargs.endpoint_url={endpoint}"]


def test_index_a_jsonl_object(s3_server, s3_root, flags):
    store, key = resolve(f"{s3_root}/d.jsonl", s3_server)
    lines = [json.dumps({"id": i, "text": "t" * i}).encode() for i in range(7)]
    store.put(key, b"\n".join(lines) + b"\n")
    run = CliRunner().invoke
    res = run(cli, ["index", f"{s3_root}/d.jsonl", "-q", *flags])
    assert res.exit_code == 0, res.output
    assert f"indexed 7 documents -> {s3_root}/d.idx" in res.output
    r = lmdata.open(f"{s3_root}/d.jsonl", format="modalities-jsonl", storage_options=s3_server)
    assert [x["id"] for x in r] == list(range(7)) and r[5]["text"] == "t" * 5
    res = run(cli, ["index", f"{s3_root}/d.jsonl", *flags])
    assert res.exit_code != 0 and "already exists" in res.output
    res = run(cli, ["index", f"{s3_root}/d.jsonl", "--overwrite", "-q", *flags])
    assert res.exit_code == 0, res.output


def test_merge_partitions_on_s3(s3_server, s3_root, flags):
    for p in range(3):
        with lmdata.writer(f"{s3_root}/out/{p}", "mds", storage_options=s3_server) as w:
            for i in range(4):
                w.write({"id": p * 10 + i})
    with lmdata.writer(f"{s3_root}/extra", "mds", storage_options=s3_server) as w:
        w.write({"id": 99})
    run = CliRunner().invoke
    args = ["merge", f"{s3_root}/out", f"{s3_root}/extra", "-o", f"{s3_root}/out", *flags]
    res = run(cli, args)
    assert res.exit_code == 0, res.output
    assert "merged 4 mds inputs: 13 records" in res.output
    r = lmdata.open(f"{s3_root}/out", storage_options=s3_server)
    assert [x["id"] for x in r] == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 99]
    assert lmdata.validate(f"{s3_root}/out", storage_options=s3_server) == []
    res = run(cli, args)
    assert res.exit_code != 0 and "already exists" in res.output


def test_merge_pbin_files_on_s3(s3_server, s3_root, flags):
    for n, docs in (("a", [[1, 2], [3]]), ("b", [[4, 5, 6]])):
        with lmdata.writer(f"{s3_root}/{n}.pbin", "modalities", storage_options=s3_server) as w:
            for d in docs:
                w.write(d)
    out = f"{s3_root}/m.pbin"
    args = ["merge", f"{s3_root}/a.pbin", f"{s3_root}/b.pbin", "-o", out, *flags]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert f"merged 2 modalities inputs: 3 records, 6 tokens -> {out}" in res.output
    r = lmdata.open(out, storage_options=s3_server)
    assert [x.tolist() for x in r] == [[1, 2], [3], [4, 5, 6]]
