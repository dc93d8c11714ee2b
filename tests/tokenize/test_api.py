"""``lmdata.tokenize``: the same bytes as the CLI for every kind of input, with no job object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import lmdata
from lmdata import _provenance
from lmdata.cli.main import cli
from lmdata.errors import DatasetNotFoundError, InvalidInputError
from lmdata.storage.manifest import is_manifest_name
from tests.inspect.conftest import bpe_file  # noqa: F401  (a fixture)

DOCS = [{"id": f"d{i}", "text": f"document {i} " * (i % 7) + "é日本"} for i in range(40)]


PROVENANCE = (".zattrs", "index.json")  # files that record the command


def files(root: Path) -> dict[str, bytes]:
    """Every file of a dataset by relative path, the provenance record without its command."""
    out = {}
    for p in sorted(root.rglob("*")) if root.is_dir() else [root]:
        if p.is_file():
            data = p.read_bytes()
            if p.name in (".zattrs", "index.json") and b'"lmdata"' in data:
                obj = json.loads(data)
                obj[_provenance.KEY].pop("command")
                data = json.dumps(obj, sort_keys=True).encode()
            elif is_manifest_name(p.name):  # it hashes those files too: their entries left out
                obj = json.loads(data)
                obj["files"] = [f for f in obj["files"] if not f["name"].endswith(PROVENANCE)]
                data = json.dumps(obj, sort_keys=True).encode()
            out[str(p.relative_to(root)) if root.is_dir() else p.name] = data
    return out


@pytest.fixture()
def corpus(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return src


@pytest.mark.parametrize(
    ("fmt", "cli_opts", "api_opts"),
    [
        ("flat-tokens", ["--validation-fraction", "0.2"], {"validation_fraction": 0.2}),
        ("mds", ["--compression", "zstd"], {"writer_options": {"compression": "zstd"}}),
    ],
)
def test_same_bytes_as_the_cli(tmp_path, corpus, bpe_file, fmt, cli_opts, api_opts):  # noqa: F811
    a, b = tmp_path / "cli", tmp_path / "api"
    args = ["tokenize", str(corpus), str(a), "--to", fmt, "--tokenizer", str(bpe_file)]
    res = CliRunner().invoke(cli, [*args, *cli_opts, "--workers", "0", "-q"])
    assert res.exit_code == 0, res.output
    summary = lmdata.tokenize(
        corpus, b, format=fmt, tokenizer=bpe_file, workers=0, batch_docs=7, **api_opts
    )
    assert summary.documents_written == len(DOCS) and summary.tokens > 0
    assert files(a) == files(b)
    assert lmdata.info(b)["provenance"]["command"].startswith(f"lmdata.tokenize('{corpus}', ")


def test_documents_as_python_objects(tmp_path, corpus, bpe_file):  # noqa: F811
    from tokenizers import Tokenizer

    want = tmp_path / "from-file"
    lmdata.tokenize([corpus], want, format="flat-tokens", tokenizer=str(bpe_file), workers=0)
    ref = files(want)
    texts = [d["text"] for d in DOCS]
    for i, inputs in enumerate(
        [
            DOCS,  # a list of dicts
            iter(texts),  # an iterator of strings
            (d for d in DOCS),  # a generator of dicts
        ]
    ):
        out = tmp_path / f"o{i}"
        s = lmdata.tokenize(inputs, out, format="flat-tokens", tokenizer=bpe_file, workers=0)
        assert s.documents_written == len(DOCS)
        assert files(out) == ref, i
    # an already-built tokenizer object
    out = tmp_path / "obj"
    tok = Tokenizer.from_file(str(bpe_file))
    lmdata.tokenize(DOCS, out, format="flat-tokens", tokenizer=tok, workers=0)
    assert [f for f, v in files(out).items() if v != ref.get(f)] == [".zattrs"]  # path differs
    assert lmdata.info(out)["provenance"]["tokenizer"]["sha256"] is not None


def test_mistakes_are_said_plainly(tmp_path):
    with pytest.raises(InvalidInputError, match="Strings in a list are paths"):
        lmdata.tokenize(["hello world"], tmp_path / "o", format="flat-tokens")
    with pytest.raises(InvalidInputError, match="document 1 is a int"):
        lmdata.tokenize(iter(["a", 2]), tmp_path / "o", format="flat-tokens", workers=0)
    with pytest.raises(InvalidInputError, match="resume=True needs inputs that are files"):
        lmdata.tokenize(DOCS, tmp_path / "o", format="flat-tokens", resume=True)
    with pytest.raises(InvalidInputError, match="cannot tokenize with a object"):
        lmdata.tokenize(DOCS, tmp_path / "o", format="flat-tokens", tokenizer=object())
    with pytest.raises(InvalidInputError, match="cannot tokenize into"):
        lmdata.tokenize(DOCS, tmp_path / "o", format="dolma")
    assert not (tmp_path / "o").exists()


def test_the_function_survives_imports_of_the_package():
    import lmdata.tokenize.pipeline
    from lmdata.tokenize import ByteTokenizer  # noqa: F401

    assert callable(lmdata.tokenize) and lmdata.tokenize.__module__ == "lmdata.tokenize.api"
    assert "tokenize" in lmdata.__all__


def test_urls_tokenize_as_their_local_copies(tmp_path, corpus):
    # a file of documents on a store: the same bytes as the local file
    url = "memory://lmdata-api-test/in/docs.jsonl"
    with lmdata.writer("memory://lmdata-api-test/in/docs.mds", "mds") as w:
        for d in DOCS:
            w.write(d)
    import fsspec

    fsspec.filesystem("memory").pipe("/lmdata-api-test/in/docs.jsonl", corpus.read_bytes())
    local, remote = tmp_path / "local", tmp_path / "remote"
    opts = {"format": "flat-tokens", "workers": 0, "validation_fraction": 0.3}
    lmdata.tokenize(corpus, local, **opts)
    s = lmdata.tokenize(url, remote, **opts)
    assert s.documents_written == len(DOCS) and files(local) == files(remote)
    assert lmdata.info(remote)["splits"]["validation"]["sequences"] > 0
    # a dataset on a store: its records' texts and ids, as the local dataset gives them
    mds = tmp_path / "docs.mds"
    with lmdata.writer(mds, "mds") as w:
        for d in DOCS:
            w.write(d)
    a, b = tmp_path / "a", tmp_path / "b"
    lmdata.tokenize(mds, a, format="flat-tokens", workers=0)
    lmdata.tokenize(["memory://lmdata-api-test/in/docs.mds"], b, format="flat-tokens", workers=0)
    assert files(a) == files(b)
    # ... with their ids, which choose the validation split as for JSONL documents
    c = tmp_path / "c"
    lmdata.tokenize(["memory://lmdata-api-test/in/docs.mds"], c, **opts)
    assert files(c) == files(local)
    with pytest.raises(DatasetNotFoundError, match="no such object"):
        lmdata.tokenize("memory://lmdata-api-test/in/gone.jsonl", tmp_path / "d", workers=0)


class FakeDataset:
    """What lmdata.tokenize sees of a Hugging Face datasets.Dataset (no dependency)."""

    def __init__(self, rows, selected=None):
        self.rows, self.selected = rows, selected

    @property
    def column_names(self):
        return self.selected or list(self.rows[0])

    def select_columns(self, names):
        return FakeDataset(self.rows, list(names))

    def __iter__(self):
        cols = self.column_names
        assert "blob" not in cols, "decoded a column tokenize does not read"
        return iter({k: r[k] for k in cols} for r in self.rows)


def test_a_datasets_dataset_is_read_by_its_columns(tmp_path):
    rows = [
        {"n": i, "body": d["text"], "id": d["id"], "blob": object()} for i, d in enumerate(DOCS)
    ]
    ref = tmp_path / "ref"
    lmdata.tokenize(DOCS, ref, workers=0, validation_fraction=0.2)
    out = tmp_path / "hf"
    s = lmdata.tokenize(FakeDataset(rows), out, text_key="body", workers=0, validation_fraction=0.2)
    assert s.documents_written == len(DOCS) and files(out) == files(ref)  # ids kept, blob unread
    with pytest.raises(InvalidInputError, match=r"no column 'text'.*body"):
        lmdata.tokenize(FakeDataset(rows), tmp_path / "x", workers=0)
    with pytest.raises(InvalidInputError, match="pass one split"):
        lmdata.tokenize({"train": FakeDataset(rows)}, tmp_path / "x", workers=0)
    with (
        pytest.warns(DeprecationWarning, match="to="),
        pytest.raises(InvalidInputError, match="give the format once"),
    ):
        lmdata.tokenize(DOCS, tmp_path / "x", to="mds", format="atlas")


def test_tokenizer_objects_are_recorded_by_name_and_hash(tmp_path, bpe_file):  # noqa: F811
    import base64

    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str
    from tokenizers import Tokenizer

    out = tmp_path / "hf"
    lmdata.tokenize(DOCS, out, tokenizer=Tokenizer.from_file(str(bpe_file)), workers=0)
    t = lmdata.info(out)["provenance"]["tokenizer"]
    assert t["path"] is None and t["name"] == "tokenizer.json" and t["kind"] == "huggingface"
    assert lmdata.info(out)["provenance"]["command"].endswith("tokenizer=<Tokenizer>)")
    text = CliRunner().invoke(cli, ["info", str(out)]).output
    assert "file: tokenizer.json  (given as an object, not saved)" in text
    # a tiktoken Encoding: saved as a ranks file that loads back as the same encoding
    ranks = {bytes([b]): b for b in range(256)} | {b"do": 256, b"cu": 257}
    enc = tiktoken.Encoding(
        "tiny", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 258}
    )
    f = tmp_path / "tiny.tiktoken"
    f.write_text("".join(f"{base64.b64encode(k).decode()} {v}\n" for k, v in ranks.items()))
    a, b = tmp_path / "a", tmp_path / "b"
    lmdata.tokenize(DOCS, a, tokenizer=f, workers=0)
    lmdata.tokenize(DOCS, b, tokenizer=enc, workers=0)
    assert [k for k, v in files(a).items() if v != files(b)[k]] == [".zattrs"]  # path only
    assert lmdata.info(b)["provenance"]["tokenizer"]["sha256"] == _provenance.file_sha256(f)
    odd = tiktoken.Encoding("odd", pat_str=r"\S+", mergeable_ranks=ranks, special_tokens={})
    with pytest.raises(InvalidInputError, match="cannot hold"):
        lmdata.tokenize(DOCS, tmp_path / "c", tokenizer=odd, workers=0)


def test_the_cli_takes_url_sources(tmp_path, corpus):
    import fsspec

    fsspec.filesystem("memory").pipe("/lmdata-api-cli/docs.jsonl", corpus.read_bytes())
    a, b = tmp_path / "a", tmp_path / "b"
    for src, dst in ((str(corpus), a), ("memory://lmdata-api-cli/docs.jsonl", b)):
        res = CliRunner().invoke(cli, ["tokenize", src, str(dst), "--to", "mds", "-q"])
        assert res.exit_code == 0, res.output
    assert files(a) == files(b)


@pytest.mark.parametrize("url", [False, True])
def test_cli_ctrl_c_names_the_work_folder_resume_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: bool
) -> None:
    from lmdata.parallel.staging import staging_for
    from lmdata.tokenize.pipeline import work_dir_for

    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "a"}\n')
    dst = "memory://revA-ctrl-c/out" if url else str(tmp_path / "out")
    work = staging_for(dst, None)

    def interrupted(*args: object, **kwargs: object) -> None:
        work.reset(b"{}")  # a job under way has its work folder
        raise KeyboardInterrupt

    monkeypatch.setattr("lmdata.cli.tokenize.tokenize", interrupted)
    try:
        res = CliRunner().invoke(cli, ["tokenize", str(src), dst, "--to", "flat-tokens", "-q"])
    finally:
        work.clear()
    assert res.exit_code == 130
    assert f"`--resume` continues from {work.where}\n" in res.output
    if not url:
        assert work.where == str(work_dir_for(Path(dst)))
    else:
        assert "memory:" not in work.where  # memory:// stages in a local temp folder


def test_cli_ctrl_c_before_any_work_offers_no_resume(tmp_path, monkeypatch) -> None:
    # Stopped before its work folder was made, a job has nothing to resume: the CLI says only
    # that it was interrupted (it once offered --resume from a folder that did not exist).
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("lmdata.cli.tokenize.tokenize", interrupted)
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "a"}\n')
    res = CliRunner().invoke(
        cli, ["tokenize", str(src), str(tmp_path / "o"), "--to", "flat-tokens"]
    )
    assert res.exit_code == 130
    assert "interrupted" in res.output and "--resume" not in res.output


@pytest.mark.parametrize("kept", [True, False])
def test_cli_a_failed_job_names_the_work_folder_it_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    # A dead worker (or a full disk) keeps the staged work for --resume, as Ctrl-C does: the
    # CLI says so under the error; a job whose work was cleared (bad data) offers nothing.
    from lmdata.parallel.staging import staging_for

    dst = str(tmp_path / "out")

    def dies(*args: object, **kwargs: object) -> None:
        if kept:
            staging_for(dst, None).reset(b"{}")
        raise lmdata.errors.LmdataError("a worker was killed by SIGKILL (unit d.jsonl)")

    monkeypatch.setattr("lmdata.cli.tokenize.tokenize", dies)
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "a"}\n')
    res = CliRunner().invoke(cli, ["tokenize", str(src), dst, "--to", "flat-tokens", "-q"])
    assert res.exit_code != 0 and "killed by SIGKILL" in res.output
    hint = f"no output written; `--resume` continues from {staging_for(dst, None).where}"
    assert (hint in res.output) is kept


def test_a_dataset_url_is_read_in_place_and_its_readers_closed(tmp_path, monkeypatch):
    import lmdata._api

    url = "memory://lmdata-api-close/in/docs.mds"
    with lmdata.writer(url, "mds") as w:
        for d in DOCS:
            w.write(d)
    real, opened = lmdata._api.open, []

    def recording(*args, **kwargs):
        reader = real(*args, **kwargs)
        close, closed = reader.close, []
        reader.close = lambda: (closed.append(True), close())[1]
        opened.append(closed)
        return reader

    monkeypatch.setattr(lmdata._api, "open", recording)
    s = lmdata.tokenize(url, tmp_path / "o", format="flat-tokens", workers=0)
    assert s.documents_written == len(DOCS)
    # one reader for its length, one for its only unit (no copy), each closed
    assert len(opened) == 2 and all(opened)


def test_cli_ctrl_c_offers_resume_for_url_inputs(tmp_path, monkeypatch):
    from lmdata.parallel.staging import staging_for

    def interrupted(*args: object, **kwargs: object) -> None:
        staging_for(str(tmp_path / "o"), None).reset(b"{}")  # a job under way has its folder
        raise KeyboardInterrupt

    monkeypatch.setattr("lmdata.cli.tokenize.tokenize", interrupted)
    src = "memory://revA-ctrl-c-in/d.jsonl"
    import fsspec

    fsspec.filesystem("memory").pipe("/revA-ctrl-c-in/d.jsonl", b'{"text": "a"}\n')
    res = CliRunner().invoke(cli, ["tokenize", src, str(tmp_path / "o"), "--to", "flat-tokens"])
    assert res.exit_code == 130
    assert "interrupted: no output written; `--resume` continues from" in res.output


def test_the_temporary_copies_are_removed_whatever_happens(tmp_path, monkeypatch, corpus):
    import tempfile

    import fsspec

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    fsspec.filesystem("memory").pipe("/lmdata-api-temp/docs.jsonl", corpus.read_bytes())
    url = "memory://lmdata-api-temp/docs.jsonl"
    s = lmdata.tokenize([url, url], tmp_path / "o", workers=0)
    assert s.documents_written == 2 * len(DOCS)
    assert list(scratch.iterdir()) == []
    with pytest.raises(InvalidInputError, match="document 1 is a int"):
        lmdata.tokenize(iter(["a", 2]), tmp_path / "p", workers=0)
    assert list(scratch.iterdir()) == []


def test_a_url_input_is_read_as_its_local_copy_would_be(tmp_path):
    import fsspec

    text = "# Notes\n\nhello world\n"
    (tmp_path / "notes.md").write_text(text)
    fsspec.filesystem("memory").pipe("/lmdata-api-md/notes.md", text.encode())
    a, b = tmp_path / "a", tmp_path / "b"
    lmdata.tokenize(tmp_path / "notes.md", a, workers=0)  # a text file, by its suffix
    s = lmdata.tokenize("memory://lmdata-api-md/notes.md", b, workers=0)
    assert s.documents_written == 1 and files(a) == files(b)


def test_cli_a_refused_resume_offers_no_resume(tmp_path: Path) -> None:
    # --resume refused (the inputs changed since the interrupted run) leaves the old work
    # folder in place: the CLI must not add "`--resume` continues from" under an error that
    # says to run again without --resume.
    from lmdata.parallel.staging import staging_for

    dst = str(tmp_path / "out")
    staging_for(dst, None).reset(b'{"another": "job"}')
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "a"}\n')
    args = ["tokenize", str(src), dst, "--to", "flat-tokens", "-q", "--resume"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code != 0 and "cannot resume" in str(res.exception) + res.output
    assert staging_for(dst, None).exists()
    assert "`--resume` continues from" not in res.output


def test_cli_bad_data_or_options_fail_as_they_are_without_looking_for_a_work_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An error that no resume survives (here: a bad output URL) is shown as it is: the CLI
    # does not resolve the output again for a work folder, which would raise anew over it
    # (the same error twice, or a store's error hiding the one that says what to fix).
    def no_lookup(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work folder was looked up for an error no resume survives")

    monkeypatch.setattr("lmdata.cli.tokenize.staging_for", no_lookup)
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "a"}\n')
    res = CliRunner().invoke(cli, ["tokenize", str(src), "bogus://x/out", "--to", "flat-tokens"])
    assert res.exit_code == 2
    assert "does not support bogus:// URLs" in res.output
    assert "unexpected" not in res.output and "--resume" not in res.output
