"""The encoders behind one Tokenizer interface: the fast one (gigatoken) gives the reference's
ids on every kind of tokenizer file it takes, falls back (saying why) on the ones it does not,
and a disagreement fails a --encoder fast job or sends an auto job back to hf."""

from __future__ import annotations

import base64
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmdata
from lmdata import formats
from lmdata.errors import InvalidInputError, LmdataError
from lmdata.tokenize import encoders
from lmdata.tokenize.encoders import adversarial_sample, choose, compare
from lmdata.tokenize.fast import FastTokenizer, Unsupported, load_fast
from lmdata.tokenize.tokenizers import load_tokenizer
from tests._manifests import restate

pytest.importorskip("gigatoken")

CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 3,
    "def tokenize(text):\n    return [t for t in text.split()]  # comment\n",
    "Hello, World! 12345 hello world HELLO world's it's we'll",
    "日本語のテキスト 中文 한국어 émigré naïve café 🙂🙃",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    "    indented\n\tcode\n\n\nwith   many    spaces\r\n",
]


def _train_bpe(path: Path, vocab: int = 600, specials: list[str] | None = None) -> Path:
    """A byte-level BPE (GPT-2 style) trained on CORPUS, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials or [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    return _train_bpe(tmp_path_factory.mktemp("bpe") / "tokenizer.json")


@pytest.fixture(scope="module")
def special_bpe(tmp_path_factory) -> Path:
    """A byte-level BPE with special and added tokens and a post-processor adding BOS."""
    from tokenizers import AddedToken, Tokenizer, processors

    p = _train_bpe(tmp_path_factory.mktemp("special") / "tokenizer.json", 700, ["<|endoftext|>"])
    tok = Tokenizer.from_file(str(p))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<pad>"])
    tok.add_tokens([AddedToken("[[added]]", normalized=False), "magic word"])
    bos = tok.token_to_id("<|im_start|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)]
    )
    tok.save(str(p))
    return p


@pytest.fixture(scope="module")
def tiktoken_file(tmp_path_factory, bpe) -> Path:
    """A tiktoken ranks file made from the trained BPE (rank = id: merges come in order)."""
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_of = {}
    for b in range(256):  # GPT-2's printable stand-in of every byte
        c = chr(b) if chr(b) in alphabet and (33 <= b <= 126 or 161 <= b <= 255) else None
        byte_of[c] = b
    byte_of.pop(None)
    n = 0
    for b in range(256):
        if chr(b) not in byte_of:
            byte_of[chr(256 + n)] = b
            n += 1
    vocab = json.loads(bpe.read_text())["model"]["vocab"]
    ranks = sorted(vocab.items(), key=lambda kv: kv[1])
    f = tmp_path_factory.mktemp("tt") / "trained.tiktoken"
    lines = [f"{base64.b64encode(bytes(byte_of[c] for c in t)).decode()} {r}" for t, r in ranks]
    f.write_text("\n".join(lines) + "\n")
    return f


def _train_sp(d: Path, normalization: str, extra_whitespace: bool = True) -> Path:
    """A SentencePiece BPE with byte fallback, trained here by sentencepiece's trainer."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([x for x in CORPUS * 30 for x in x.split("\n") if x.strip()]),
        model_prefix=str(d / "sp"),
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name=normalization,
        remove_extra_whitespaces=extra_whitespace,
        minloglevel=2,
    )
    return d / "sp.model"


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory) -> Path:
    """Without normalization, whitespace kept (as Llama's): the fast encoder implements it."""
    return _train_sp(tmp_path_factory.mktemp("sp"), "identity", extra_whitespace=False)


@pytest.fixture(scope="module")
def sp_nfkc(tmp_path_factory) -> Path:
    """sentencepiece's default normalization (NFKC by its precompiled map)."""
    return _train_sp(tmp_path_factory.mktemp("spnfkc"), "nmt_nfkc")


@pytest.fixture(scope="module")
def unigram(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(
        CORPUS * 20, trainers.UnigramTrainer(vocab_size=200, show_progress=False)
    )
    p = tmp_path_factory.mktemp("uni") / "tokenizer.json"
    tok.save(str(p))
    return p


KINDS = ["bpe", "special_bpe", "tiktoken_file", "sp_model"]


@pytest.fixture(params=KINDS)
def tokenizer_file(request) -> Path:
    return request.getfixturevalue(request.param)


def test_the_fast_encoder_takes_every_kind(tokenizer_file):
    fast = load_fast(str(tokenizer_file))
    assert isinstance(fast, FastTokenizer)
    assert fast.vocab_size == load_tokenizer(str(tokenizer_file)).vocab_size
    assert choose(str(tokenizer_file), "auto", False).encoder == "fast"


@pytest.mark.parametrize("special", [False, True])
def test_adversarial_sample_gives_the_reference_ids(tokenizer_file, special):
    fast = load_fast(str(tokenizer_file))
    sample = adversarial_sample(fast.reference)
    assert compare(fast, fast.reference, sample, special) is None
    # compared text by text too: a refusal (lone surrogates) is the reference's refusal
    for text in sample:
        mine = encoders._ids(fast, [text], special)[0]
        ref = encoders._ids(fast.reference, [text], special)[0]
        if isinstance(ref, str):
            assert isinstance(mine, str), text
        else:
            assert np.array_equal(mine, ref), text


def test_special_tokens_split_and_post_processor_as_the_reference(special_bpe):
    fast = load_fast(str(special_bpe))
    ref = fast.reference
    text = "a<|endoftext|>b [[added]] magic word <|im_end|>"
    for special in (False, True):
        got = fast.encode_batch([text], add_special_tokens=special)[0]
        want = ref.encode_batch([text], add_special_tokens=special)[0]
        assert got.tolist() == want.tolist()
    assert fast.encode_batch(["x"], add_special_tokens=True)[0][0] == ref.token_id("<|im_start|>")


texts = st.lists(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=80)
    | st.sampled_from(["<|endoftext|>", "<|im_start|>", " ", "\n\n", "[[added]]", "🙂"]),
    max_size=6,
).map(lambda xs: ["".join(xs), *xs])


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=texts)
def test_hypothesis_texts_give_the_reference_ids(request, kind, batch):
    fast = _fast(request, kind)
    assert compare(fast, fast.reference, batch, False) is None
    if kind == "special_bpe":
        assert compare(fast, fast.reference, batch, True) is None


def _fast(request, kind: str) -> FastTokenizer:
    cache = request.config.__dict__.setdefault("_lmdata_fast", {})
    path = str(request.getfixturevalue(kind))
    if path not in cache:
        cache[path] = load_fast(path)
    return cache[path]


PATHOLOGICAL = {
    "a * 10**6": lambda: "a" * 10**6,
    "^ * 10**6": lambda: "^" * 10**6,
    "10 MB minified line": lambda: (
        "function f(a,b){return a+b};var x={k:[1,2,3],s:'str\\n'};if(x.k){f(1,2)}" * 140_000
    )[: 10 * 10**6],
    "1 MB of one emoji": lambda: "\U0001f642" * (10**6 // 4),
    "whitespace only": lambda: " \t\n \r\n  " * 100_000,
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if "10 MB" in n else n  # the reference: ~10 s
        for n in PATHOLOGICAL
    ],
)
def test_pathological_documents_give_the_reference_ids(bpe, name):
    """The bench times these on the fast path; here the ids must equal the reference's."""
    fast = load_fast(str(bpe))
    text = PATHOLOGICAL[name]()
    got = fast.encode_batch([text])[0]
    want = fast.reference.encode_batch([text])[0]
    assert len(got) == len(want) and encoders.first_difference(got, want) == -1


def test_unigram_falls_back_to_hf_and_says_why(unigram, tmp_path, caplog):
    with pytest.raises(Unsupported, match="Unigram"):
        load_fast(str(unigram))
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    with caplog.at_level(logging.INFO, logger="lmdata.tokenize"):
        s = lmdata.tokenize(src, tmp_path / "o.zarr", tokenizer=str(unigram), workers=0)
    assert s.encoder == "hf" and "(encoder hf)" in s.line()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["encoder: hf (fast encoder not used: its model is Unigram, not BPE)"]
    prov = lmdata.info(tmp_path / "o.zarr")["provenance"]["tokenizer"]
    assert prov["encoder"] == "hf"
    with pytest.raises(InvalidInputError, match=r"--encoder fast cannot encode.*Unigram"):
        lmdata.tokenize(src, tmp_path / "f.zarr", tokenizer=str(unigram), encoder="fast")
    assert not (tmp_path / "f.zarr").exists()


def test_nfkc_edge_cases_the_fast_encoder_gets_wrong_send_auto_to_hf(sp_nfkc):
    """gigatoken 0.10 normalizes a few NFKC sequences (Hangul jamo, stacked accents) unlike
    sentencepiece's map: the adversarial sample catches it before any work."""
    fast = load_fast(str(sp_nfkc))  # it loads...
    assert compare(fast, fast.reference, adversarial_sample(fast.reference), False) is not None
    c = choose(str(sp_nfkc), "auto", False)  # ...but is not used
    assert c.encoder == "hf" and "of the built-in check sample" in c.note
    with pytest.raises(LmdataError, match="differ from the reference's on text"):
        choose(str(sp_nfkc), "fast", False)


def test_fast_not_installed_falls_back(bpe, monkeypatch):
    monkeypatch.setitem(sys.modules, "gigatoken.gigatoken_rs", None)
    c = choose(str(bpe), "auto", False)  # said at the info level, not warned on every job
    assert c.encoder == "hf" and not c.note and "pip install 'lmdata[fast]'" in c.hint
    with pytest.raises(InvalidInputError, match=r"lmdata\[fast\]"):
        choose(str(bpe), "fast", False)


def test_the_sample_checked_during_a_job_is_deterministic_and_bounded(monkeypatch):
    monkeypatch.setattr(encoders, "CHECK_SHARE", 512)  # the mechanism, on a small sample
    rng = np.random.default_rng(0)
    batches = [["x" * int(n) for n in rng.integers(0, 3000, 64)] for _ in range(200)]
    picks = []
    allowance, checked = -1.0, 0
    for seq, texts in enumerate(batches):
        j, allowance = encoders.pick(texts, allowance, salt=seq)
        picks.append(j)
        checked += min(len(texts[j]), encoders.CHECK_MAX_CHARS) if j >= 0 else 0
    total = sum(len(t) for b in batches for t in b)
    assert picks[0] >= 0  # a unit's first batch always checks one
    assert 5 < sum(j >= 0 for j in picks) < 100
    assert checked <= total / encoders.CHECK_SHARE + encoders.CHECK_MAX_CHARS
    again = []
    allowance = -1.0
    for seq, texts in enumerate(batches):
        j, allowance = encoders.pick(texts, allowance, salt=seq)
        again.append(j)
    assert again == picks


# ---- a planted mismatch -----------------------------------------------------------------------

PLANT = "PLANTED"


def _plant(monkeypatch) -> None:
    """The fast encoder gets the last id wrong on every text holding PLANT; every batch has a
    document checked (a small job's share is otherwise a document every few hundred)."""
    real = FastTokenizer.encode_flat
    monkeypatch.setattr(encoders, "CHECK_SHARE", 1)

    def wrong(self, texts, add_special_tokens=False):
        flat, lengths = real(self, texts, add_special_tokens)
        flat = flat.copy()
        ends = np.cumsum(lengths)
        for i, t in enumerate(texts):
            if PLANT in t and lengths[i]:
                flat[ends[i] - 1] ^= 1
        return flat, lengths

    monkeypatch.setattr(FastTokenizer, "encode_flat", wrong)


def _docs(path: Path, n: int, planted_from: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            text = CORPUS[i % len(CORPUS)] + (f" {PLANT} {i}" if i >= planted_from else f" {i}")
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


@pytest.mark.parametrize("planted_from", [3, 400])  # in the first documents; later in the job
@pytest.mark.parametrize("workers", [0, 2])
def test_a_planted_mismatch_fails_an_explicit_fast_job(
    bpe, tmp_path, monkeypatch, planted_from, workers
):
    _plant(monkeypatch)
    src = _docs(tmp_path / "d.jsonl", 600, planted_from)
    with pytest.raises(LmdataError, match="differ from the reference") as ei:
        lmdata.tokenize(
            src, tmp_path / "o.zarr", tokenizer=str(bpe), encoder="fast", workers=workers
        )
    msg = str(ei.value)
    if planted_from == 3:
        assert "document 4 of the job" in msg  # the job's first documents, before any work
    else:
        line = int(re.search(r"line (\d+)", msg).group(1))
        assert line > planted_from and str(src) in msg
    assert re.search(r"at token \d+: fast \d+, reference \d+", msg)
    assert not (tmp_path / "o.zarr").exists()
    assert not list(tmp_path.glob(".o.zarr*"))  # no work folder, no half-written output


@pytest.mark.parametrize(("planted_from", "workers"), [(3, 0), (400, 0), (400, 2)])
def test_a_planted_mismatch_sends_auto_back_to_hf_before_anything_is_written(
    bpe, tmp_path, monkeypatch, caplog, planted_from, workers
):
    _plant(monkeypatch)
    src = _docs(tmp_path / "d.jsonl", 600, planted_from)
    dst = tmp_path / "o.zarr"
    seen = []  # what was at DST when the job said it falls back
    real_note = encoders.note

    def note(choice):
        seen.append((choice.encoder, dst.exists()))
        real_note(choice)

    import importlib

    monkeypatch.setattr(importlib.import_module("lmdata.tokenize.pipeline"), "note", note)
    with caplog.at_level(logging.WARNING, logger="lmdata.tokenize"):
        s = lmdata.tokenize(src, dst, tokenizer=str(bpe), workers=workers, batch_docs=32)
    assert s.encoder == "hf"
    assert seen[-1] == ("hf", False)
    assert seen[0][0] == ("hf" if planted_from == 3 else "fast")
    assert "differ from the reference" in caplog.text
    want = lmdata.tokenize(src, tmp_path / "hf.zarr", tokenizer=str(bpe), encoder="hf")
    assert s.tokens == want.tokens
    a, b = lmdata.open(dst), lmdata.open(tmp_path / "hf.zarr")
    assert all(np.array_equal(a[i], b[i]) for i in range(len(b)))


# ---- same bytes with either encoder -----------------------------------------------------------

_ENCODER = re.compile(rb'"encoder": ?"[^"]*"')


def tree(p: Path) -> dict[str, bytes]:
    """Every file of a dataset, the provenance's encoder name blanked (it names the encoder
    and is the only difference), the manifest as it would be for the blanked bytes."""
    files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
    side = [Path(str(p) + s) for s in (".lmdata.json", ".lmdata-manifest")] if p.is_file() else []
    original = {
        (f.name if p.is_file() else str(f.relative_to(p))): f.read_bytes()
        for f in files + [s for s in side if s.exists()]
    }
    assert any(k.endswith("lmdata-manifest") for k in original), "every job writes a manifest"
    blanked = {k: _ENCODER.sub(b'"encoder": ""', v) for k, v in original.items()}
    return restate(blanked, original)


@pytest.mark.parametrize("to", formats.token_targets())
def test_fast_and_hf_write_the_same_bytes_for_every_token_format(special_bpe, tmp_path, to):
    src = _docs(tmp_path / "d.jsonl", 300, 10**9)
    dst = tmp_path / ("o.pbin" if to == "modalities" else "o")
    out = {}
    for enc in ("hf", "fast"):
        s = lmdata.tokenize(
            src,
            dst,
            format=to,
            tokenizer=str(special_bpe),
            encoder=enc,
            eod="<|endoftext|>",
            overwrite=True,
            workers=2,
        )
        assert s.encoder.startswith(enc)
        out[enc] = tree(dst)
        prov = lmdata.info(dst)["provenance"]["tokenizer"]
        assert prov["encoder"].startswith(enc)
    assert out["hf"] == out["fast"]


def test_the_cli_takes_encoder_and_says_which(bpe, tmp_path):
    from click.testing import CliRunner

    from lmdata.cli.main import cli

    src = _docs(tmp_path / "d.jsonl", 50, 10**9)
    r = CliRunner().invoke(
        cli,
        [
            "tokenize",
            str(src),
            str(tmp_path / "o"),
            "--to",
            "flat-tokens",
            "--tokenizer",
            str(bpe),
            "--encoder",
            "fast",
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "(encoder fast (gigatoken 0.10" in r.output
    r = CliRunner().invoke(cli, ["tokenize", "--help"])
    assert "--encoder [auto|fast|hf]" in r.output


def test_import_lmdata_never_imports_the_fast_encoder():
    code = (
        "import sys, lmdata, lmdata.tokenize.pipeline, lmdata.tokenize.encoders\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'gigatoken', 'awkward'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- resume and Ray with the fast encoder -----------------------------------------------------


def _interrupt_once_done(work: Path):
    """A progress callback that stops the job (Ctrl-C) at its first report after a unit was
    marked done in ``work``: counting reports would stop it at a point that depends on how
    often progress is reported."""

    def progress(event):
        done = work / "done.log"
        if done.exists() and done.read_text():
            raise KeyboardInterrupt

    return progress


def test_a_fast_job_resumes_to_the_bytes_of_an_hf_job(bpe, tmp_path):
    from lmdata.tokenize.pipeline import TokenizeJob, tokenize, work_dir_for

    src = _docs(tmp_path / "d.jsonl", 3000, 10**9)
    job = TokenizeJob(to="flat-tokens", tokenizer=str(bpe), batch_docs=64)
    tokenize([src], tmp_path / "ref", job, workers=0, encoder="hf", range_bytes=20_000)
    with pytest.raises(KeyboardInterrupt):
        tokenize(
            [src],
            tmp_path / "out",
            job,
            workers=2,
            encoder="fast",
            range_bytes=20_000,
            progress=_interrupt_once_done(work_dir_for(tmp_path / "out")),
        )
    assert (work_dir_for(tmp_path / "out") / "done.log").read_text()  # some units are done
    seen = []
    s = tokenize(
        [src],
        tmp_path / "out",
        job,
        workers=2,
        encoder="fast",
        range_bytes=20_000,
        resume=True,
        progress=lambda e: seen.append(e.done) if e.unit == "documents" else None,
    )
    assert s.encoder.startswith("fast") and 0 < seen[-1] < 3000  # the rest only
    assert tree(tmp_path / "out") == tree(tmp_path / "ref")


def test_a_fast_job_on_ray_writes_the_bytes_of_an_hf_job(bpe, tmp_path):
    pytest.importorskip("ray")
    from lmdata.tokenize.pipeline import TokenizeJob, tokenize
    from tests.parallel._ray_local import started_ray

    src = _docs(tmp_path / "d.jsonl", 1500, 10**9)
    job = TokenizeJob(to="flat-tokens", tokenizer=str(bpe), batch_docs=64)
    tokenize([src], tmp_path / "ref", job, workers=0, encoder="hf")
    with started_ray():
        s = tokenize(
            [src],
            tmp_path / "out",
            job,
            engine="ray",
            workers=2,
            encoder="fast",
            range_bytes=15_000,
        )
    assert s.encoder.startswith("fast")
    assert tree(tmp_path / "out") == tree(tmp_path / "ref")


@pytest.mark.parametrize("encoder", ["fast", "hf"])
def test_modalities_pack_takes_encoder_and_stays_byte_identical(tmp_path, monkeypatch, encoder):
    """`lmdata modalities data pack_encoded_data --encoder ...` writes modalities 0.5.0's
    reference .pbin with either encoder."""
    import shutil

    from click.testing import CliRunner

    from lmdata.cli.main import cli
    from tests.compat.test_modalities import MOD, _config

    (tmp_path / "data").mkdir()
    shutil.copy(MOD / "docs.jsonl", tmp_path / "data" / "docs.jsonl")
    shutil.copytree(MOD / "tokenizers", tmp_path / "data" / "tokenizers")
    monkeypatch.chdir(tmp_path)
    run = CliRunner().invoke
    assert run(cli, ["modalities", "data", "create_raw_index", "data/docs.jsonl"]).exit_code == 0
    res = run(cli, ["modalities", "data", "pack_encoded_data", _config(), "--encoder", encoder])
    assert res.exit_code == 0, res.output
    assert f"(encoder {encoder}" in res.output
    assert Path("data/docs.pbin").read_bytes() == (MOD / "docs_bpe5k.pbin").read_bytes()


@pytest.mark.parametrize("encoder", ["fast", "hf"])
def test_a_text_file_that_is_not_utf8_is_an_error_naming_the_byte(bpe, tmp_path, encoder):
    """No encoder takes lone surrogates (the old surrogateescape decoding crashed both with a
    TypeError); the document is invalid input, skipped with --skip-invalid."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(b"hello \xff world\n")
    (tmp_path / "in" / "b.txt").write_text("fine")
    kw = {"tokenizer": str(bpe), "encoder": encoder, "workers": 0}
    with pytest.raises(InvalidInputError, match=r"a\.txt: record 1: not UTF-8 text \(byte 6"):
        lmdata.tokenize(tmp_path / "in", tmp_path / "o", **kw)
    s = lmdata.tokenize(tmp_path / "in", tmp_path / "o", skip_invalid=True, **kw)
    assert (s.documents_read, s.documents_written, s.documents_skipped) == (2, 1, 1)
