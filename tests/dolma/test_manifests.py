"""The Dolma toolkit's outputs in their tree's manifest (``<tree>/lmdata-manifest``, beside
``documents/`` and ``attributes/``): tag, dedupe, decontaminate add their attribute files when
done, mix its shards when its output is a tree's documents folder, every other entry kept; a
damaged, truncated or deleted output is then found by ``validate``; dolma's globs never meet
the manifest. Local disk and the loopback S3 server."""

from __future__ import annotations

import gzip

import pytest

import lmdata
from lmdata.dolma.config import DedupeConfig, MixerConfig
from lmdata.dolma.decontam import decontaminate_paths
from lmdata.dolma.dedupe import dedupe
from lmdata.dolma.mixer import mix
from lmdata.dolma.tag import tag_paths
from lmdata.formats.dolma._paths import expand_globs
from lmdata.storage import resolve
from lmdata.storage.manifest import NAME, Manifest


def _tree(url: str, manifest: bool = True) -> None:
    with lmdata.writer(url, "dolma", max_file_docs=15, manifest=manifest) as w:
        for i in range(40):
            w.write({"id": str(i), "text": f"document {i % 25} " * (i % 5 + 2), "source": "s"})


def _manifest(url: str) -> Manifest:
    store, key = resolve(url)
    return Manifest.parse(store.read(f"{key}/{NAME}"), url)


def _put(store, key: str, data: bytes) -> None:
    if store.can_mmap:
        with open(key, "wb") as f:
            f.write(data)
    else:
        store.fs.pipe_file(key, data)


def _names(url: str) -> list[str]:
    return sorted(e.name for e in _manifest(url).files)


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "s3":
        return request.getfixturevalue("s3_root")
    return str(tmp_path)


def test_every_toolkit_job_adds_its_outputs_to_the_trees_manifest(root, tmp_path):
    tree = f"{root}/t"
    _tree(tree)
    docs = _names(tree)
    assert docs and all(n.startswith("documents/") for n in docs)
    tag_paths(f"{tree}/documents/*", ["char_length_v1"], experiment="len", engine="inprocess")
    cfg = {"documents": [f"{tree}/documents/*"], "dedupe": {"name": "dup", "documents": {}}}
    cfg["dedupe"]["documents"] = {"attribute_name": "dup", "key": "$.text"}
    dedupe(DedupeConfig.from_dict(cfg), engine="inprocess")
    evals = tmp_path / "evals.jsonl"
    evals.write_text('{"text": "document 3 document 3 document 3"}\n')
    decontaminate_paths(f"{tree}/documents/*", str(evals), ngram=3, engine="inprocess")
    names = _names(tree)
    for folder in ("attributes/len/", "attributes/dup/", "attributes/decontam/"):
        assert [n for n in names if n.startswith(folder)] == [
            n.replace("documents/", folder) for n in docs
        ], folder
    assert [n for n in names if n.startswith("documents/")] == docs  # kept as they were
    assert _manifest(tree).records == 40 and _manifest(tree).format == "dolma"
    assert lmdata.validate(tree, deep=True) == []
    # dolma's globs never meet the manifest: it is in none of the folders they list
    assert not [
        f for f in expand_globs([f"{tree}/documents/*", f"{tree}/attributes/*/*"]) if NAME in f
    ]

    store, key = resolve(tree)
    victim = f"{key}/attributes/dup/{docs[1].split('/', 1)[1]}"
    old = store.read(victim)
    flipped = bytearray(old)
    flipped[len(old) // 2] ^= 0x10
    _put(store, victim, bytes(flipped))
    got = lmdata.validate(tree, deep=True)
    assert any(p.startswith(store.url(victim) + ": bytes") for p in got), got
    _put(store, victim, old[:-3])
    assert any(p.startswith(store.url(victim) + ": truncated") for p in lmdata.validate(tree))
    store.remove(victim)
    assert any(p.startswith(store.url(victim) + ": deleted") for p in lmdata.validate(tree))


def test_a_job_run_again_rehashes_what_it_wrote_and_keeps_the_rest(tmp_path):
    tree = tmp_path / "t"
    _tree(str(tree))

    def tag(name: str, **kw) -> None:
        docs = str(tree / "documents" / "*")
        tag_paths(docs, ["char_length_v1"], experiment=name, engine="inprocess", **kw)

    tag("a")
    victim = sorted((tree / "attributes" / "a").iterdir())[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1  # damaged (same size) before the next job
    victim.write_bytes(bytes(data))
    tag("b")  # another job: what it did not write keeps its entries, so the damage is found
    got = [p.split(": ")[0] for p in lmdata.validate(tree, deep=True) if "differ" in p]
    assert got == [str(victim)]
    tag("a", ignore_existing=True)  # the job that wrote it writes it again: hashed anew
    assert lmdata.validate(tree, deep=True) == []


def test_a_tree_another_tool_wrote_gets_a_manifest_of_the_jobs_files(tmp_path):
    tree = tmp_path / "t"
    _tree(str(tree), manifest=False)
    tag_paths(str(tree / "documents" / "*"), ["char_length_v1"], experiment="a", engine="inprocess")
    names = _names(str(tree))
    assert names and all(n.startswith("attributes/a/") for n in names)
    assert lmdata.validate(tree, deep=True) == []
    lmdata.open(tree).close()


def test_mix_into_a_trees_documents_lists_its_shards(root):
    src = f"{root}/src"
    _tree(src)
    stream = {
        "name": "m",
        "documents": [f"{src}/documents/*"],
        "output": {"path": f"{root}/mixed/documents", "max_size_in_bytes": 1 << 20},
        "filter": {"syntax": "jsonpath", "exclude": ["$[?(@.id == '3')]"]},
    }
    res = mix(MixerConfig.from_dict({"streams": [stream]}), engine="inprocess")
    names = _names(f"{root}/mixed")
    assert names == sorted(o.split("/mixed/", 1)[1] for o in res.outputs)
    assert lmdata.validate(f"{root}/mixed", deep=True) == []
    out = f"{root}/plain-out"  # a folder in no tree: the origin's shards only
    stream = {**stream, "output": {"path": out, "max_size_in_bytes": 1 << 20}}
    mix(MixerConfig.from_dict({"streams": [stream]}), engine="inprocess")
    store, key = resolve(out)
    assert not [n for n in store.list(key) if "manifest" in n]
    assert gzip.decompress(store.read(f"{key}/{store.list(key)[0]}"))
