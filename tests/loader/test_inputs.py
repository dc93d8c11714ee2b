"""What the Loader takes: token datasets made by ``lmdata tokenize`` in any format (records
formats opened by the column their provenance names), mappings of sources to weights, the start
token of the recorded tokenizer; a finite loader iterated again."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import lmdata
from lmdata.errors import InvalidInputError
from lmdata.loader import Loader
from tests.inspect.conftest import CORPUS
from tests.loader.conftest import random_seqs, write_flat

DOCS = [{"text": f"{CORPUS[i % len(CORPUS)]} {i}"} for i in range(60)]


def _tokenizer(path, special: list[str], added: list[str] = ()):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    if added:  # special tokens after the vocabulary (GPT-2's <|endoftext|> is its last id)
        tok.add_special_tokens(list(added))
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    src = d / "docs.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in DOCS))
    return src


@pytest.fixture(scope="module")
def made(tmp_path_factory, corpus):
    """The corpus tokenized into flat-tokens, MDS, Atlas and a Modalities .pbin with one
    tokenizer whose BOS is a special token."""
    d = tmp_path_factory.mktemp("made")
    tok = _tokenizer(d / "tok.json", ["<|endoftext|>", "<|begin_of_text|>"])
    out = {}
    for fmt in ("flat-tokens", "mds", "atlas"):
        out[fmt] = d / fmt
        lmdata.tokenize(corpus, out[fmt], format=fmt, tokenizer=tok, workers=0)
    out["modalities"] = d / "m.pbin"  # (Modalities ends every document with its EOD)
    lmdata.tokenize(
        corpus,
        out["modalities"],
        format="modalities",
        tokenizer=tok,
        workers=0,
        eod="<|endoftext|>",
    )
    return out


def test_mds_and_atlas_from_tokenize_mix_with_flat_tokens_and_pbin_without_token_column(made):
    readers = {fmt: lmdata.open(p) for fmt, p in made.items()}
    flat = [np.asarray(x) for x in lmdata.open(made["flat-tokens"])]
    eod = lmdata.info(made["modalities"])["provenance"]["tokenizer"]["eod_id"]
    loader = Loader(
        [str(made[f]) for f in ("mds", "atlas", "flat-tokens", "modalities")],
        seq_len=16,
        global_batch_size=6,
        mode="bestfit",
        rank=0,
        world_size=1,
    )
    assert [s.reader.token_column for s in loader.sources[:2]] == ["tokens", "tokens"]
    # each source holds the same documents (the .pbin ones each followed by its EOD)
    want = [flat] * 3 + [[np.append(w, eod) for w in flat]]
    for k in range(4):
        docs = loader.sources[k].reader
        assert [np.asarray(docs[i]).tolist() for i in range(len(docs))] == [
            w.tolist() for w in want[k]
        ]
    served = set()
    for step in range(10):
        batch = loader.batch(step)
        lin = loader.explain(step)
        for i in range(6):
            at = 0
            for s in lin[i]:
                got = batch["targets"][i, at : at + s.length]
                doc = want[s.source][s.document]
                assert got.tolist() == doc[s.offset : s.offset + s.length].tolist()
                at += s.length
                served.add(s.source)
    assert served == {0, 1, 2, 3}
    assert readers["mds"].__class__.__name__ == "MDSReader"  # opened as records by open()


def test_a_mapping_of_sources_to_weights(made):
    paths = {str(made["mds"]): 1, str(made["flat-tokens"]): 3}
    loader = Loader(paths, seq_len=8, global_batch_size=8, rank=0, world_size=1)
    counts = loader.mixture.counts(0)
    assert counts.tolist() == [2, 6]
    with pytest.raises(InvalidInputError, match="weights once"):
        Loader(paths, weights=[1, 1], seq_len=8, global_batch_size=8)


def test_a_records_dataset_without_a_token_column_names_its_columns(tmp_path):
    d = tmp_path / "rec.mds"
    with lmdata.writer(d, "mds", columns={"text": "str", "ids": "ndarray:int32"}) as w:
        for i in range(5):
            w.write({"text": f"t{i}", "ids": np.arange(i + 3, dtype=np.int32)})
    with pytest.raises(InvalidInputError, match=r"columns ids, text: .*\(here: ids\)"):
        Loader(str(d), seq_len=4, global_batch_size=2)
    loader = Loader(str(d), seq_len=4, global_batch_size=2, token_column="ids")
    assert loader.batch(0)["targets"].shape == (2, 4)


def test_the_start_token_is_the_recorded_tokenizers_bos(made):
    loader = Loader(str(made["flat-tokens"]), seq_len=16, global_batch_size=4, rank=0)
    prov = lmdata.info(made["flat-tokens"])["provenance"]
    bos = prov["tokenizer"]["special_tokens"]["<|begin_of_text|>"]
    assert bos != 0 and loader.bos_id == bos
    batch = loader.batch(0)
    starts = batch["positions"] == 0
    assert (batch["inputs"][starts] == bos).all()
    assert Loader(str(made["flat-tokens"]), seq_len=16, global_batch_size=4, bos_id=7).bos_id == 7


def test_the_start_token_is_the_post_processors_bos(tmp_path, corpus):
    """A tokenizer whose post-processor puts a token (named like no BOS) before every text,
    tokenized with its special tokens: the recorded bos_id, not a special token found by its
    name, starts each document."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    path = _tokenizer(tmp_path / "cls.json", ["<|endoftext|>", "<s>", "[CLS]"])
    tok = Tokenizer.from_file(str(path))
    cls = tok.token_to_id("[CLS]")
    tok.post_processor = TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", cls)])
    tok.save(str(path))
    out = tmp_path / "cls.zarr"
    lmdata.tokenize(corpus, out, tokenizer=path, workers=0, special_tokens=True)
    assert lmdata.info(out)["provenance"]["tokenizer"]["bos_id"] == cls
    loader = Loader(str(out), seq_len=16, global_batch_size=4, mode="bestfit")
    assert loader.bos_id == cls != tok.token_to_id("<s>")
    batch = loader.batch(0)
    assert (batch["inputs"][batch["positions"] == 0] == cls).all()


def test_a_vocabulary_whose_id_0_is_a_token_is_said_once(tmp_path, corpus):
    tok = _tokenizer(tmp_path / "gpt2like.json", [], added=["<|endoftext|>"])
    out = tmp_path / "g.zarr"
    lmdata.tokenize(corpus, out, tokenizer=tok, workers=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = Loader(str(out), seq_len=8, global_batch_size=2)
        Loader(str(out), seq_len=8, global_batch_size=2)
    said = [w for w in caught if "id 0 is an ordinary token" in str(w.message)]
    assert len(said) == 1 and a.bos_id == 0
    assert said[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Loader(str(out), seq_len=8, global_batch_size=2, bos_id=0)  # said explicitly: silent
        lmdata.tokenize(corpus, tmp_path / "b.zarr", workers=0)  # bytes: id 0 is no byte
        assert Loader(str(tmp_path / "b.zarr"), seq_len=8, global_batch_size=2).bos_id == 0


@pytest.mark.parametrize("mode", ["packed", "bestfit"])
def test_a_finite_loader_iterated_twice_gives_the_same_batches_twice(tmp_path, mode):
    src = write_flat(tmp_path / "d.zarr", random_seqs(3, 60))
    loader = Loader(src, seq_len=8, global_batch_size=4, mode=mode, epochs=1, rank=0)
    first = [b["targets"].copy() for b in loader]
    second = [b["targets"].copy() for b in loader]
    assert len(first) == loader.num_steps and len(second) == len(first)
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    # a resumed pass finishes from where it was, and the next one is whole
    loader.step = 2
    assert len(list(loader)) == loader.num_steps - 2 and len(list(loader)) == loader.num_steps


def test_a_finite_torch_loader_iterated_twice(tmp_path):
    pytest.importorskip("torch")
    src = write_flat(tmp_path / "d.zarr", random_seqs(3, 60))
    loader = Loader(src, seq_len=8, global_batch_size=4, epochs=1, rank=0)
    tl = loader.torch_loader(num_workers=1)
    first = [b["targets"].clone() for b in tl]
    assert len(tl) == len(first) == loader.num_steps
    second = [b["targets"].clone() for b in tl]
    assert len(first) == len(second)
    assert all(bool((a == b).all()) for a, b in zip(first, second, strict=True))
