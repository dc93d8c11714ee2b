"""modalities merge: correct offsets (the origin's are 12 bytes short per earlier file)."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from lmdata.cli.main import cli
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats import modalities
from lmdata.formats.modalities import Writer

DATA = Path(__file__).parent.parent / "data" / "modalities"


def make(path: Path, docs: list[list[int]], width: int) -> Path:
    with Writer(path, token_width=width) as w:
        for d in docs:
            w.write(d)
    return path


def origin_merge(paths: list[Path], out: Path) -> None:
    """What modalities' merge_packed_data writes, bug included."""
    datas, index, shift = [], [], 0
    for p in paths:
        raw = p.read_bytes()
        n, w = struct.unpack("<QI", raw[:12])
        datas.append(raw[12 : 12 + n])
        index += [(o + shift, ln) for o, ln in pickle.loads(raw[12 + n :])]
        shift += n - 12  # the bug: should be n
    data = b"".join(datas)
    out.write_bytes(struct.pack("<QI", len(data), w) + data + pickle.dumps(index, protocol=4))


A = [[1, 2, 3], [4], [5, 6]]
B = [[7, 8], [9, 10, 11, 12]]
C = [[13]]


def test_merge_reads_back_exactly(tmp_path: Path) -> None:
    paths = [make(tmp_path / f"{n}.pbin", d, 2) for n, d in (("a", A), ("b", B), ("c", C))]
    out = tmp_path / "m.pbin"
    msg = modalities.merge([str(p) for p in paths], str(out))
    assert msg.records == 6 and msg.line().startswith("merged 3 modalities inputs: 6 records")
    r = modalities.open(out)
    assert [d.tolist() for d in r] == A + B + C
    assert r.contiguous and modalities.validate(out) == []
    # byte-identical to writing all documents in one go
    assert out.read_bytes() == make(tmp_path / "one.pbin", A + B + C, 2).read_bytes()


def test_merge_of_directories_sorted_and_of_mixed_widths(tmp_path: Path) -> None:
    d = tmp_path / "parts"
    (d / "sub").mkdir(parents=True)
    make(d / "b.pbin", B, 1)
    make(d / "sub" / "c.pbin", [[70000]], 4)
    make(d / "a.pbin", A, 2)
    out = tmp_path / "m.pbin"
    modalities.merge([str(d)], str(out))
    r = modalities.open(out)
    assert r.token_width == 4
    assert [x.tolist() for x in r] == A + B + [[70000]]


def test_merge_refuses_existing_output_and_self(tmp_path: Path) -> None:
    a = make(tmp_path / "a.pbin", A, 2)
    b = make(tmp_path / "b.pbin", B, 2)
    with pytest.raises(OutputExistsError):
        modalities.merge([str(a)], str(b))
    with pytest.raises(InvalidInputError, match="also an input"):
        modalities.merge([str(a)], str(a), overwrite=True)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InvalidInputError, match=r"no \.pbin"):
        modalities.merge([str(tmp_path / "empty_dir")], str(tmp_path / "o.pbin"))


def test_origin_merged_file_is_read_with_corrected_offsets(tmp_path: Path) -> None:
    paths = [make(tmp_path / f"{n}.pbin", d, 2) for n, d in (("a", A), ("b", B), ("c", C))]
    bad = tmp_path / "origin.pbin"
    origin_merge(paths, bad)
    idx = pickle.loads(bad.read_bytes()[12 + 26 :])
    assert idx[3] == (12 - 12, 4)  # B's first document at byte 12 - 12: the origin's bug
    r = modalities.open(bad)
    assert r.repaired_origin_merge
    assert [d.tolist() for d in r] == A + B + C
    problems = modalities.validate(bad)
    assert len(problems) == 1 and "12 bytes too low" in problems[0] and "3 files" in problems[0]
    # without the repair, the spans are what modalities itself reads: 12 bytes per file early
    raw = modalities.open(bad, repair_origin_merge=False)
    assert not raw.repaired_origin_merge
    assert raw[3].tolist() == [1, 2] and raw[5].tolist() == [1]
    # merging it again through lmdata writes a correct file
    fixed = tmp_path / "fixed.pbin"
    modalities.merge([str(bad)], str(fixed))
    assert modalities.validate(fixed) == []
    assert [d.tolist() for d in modalities.open(fixed)] == A + B + C


def test_origin_merge_with_an_empty_first_file(tmp_path: Path) -> None:
    empty = make(tmp_path / "e.pbin", [], 2)
    b = make(tmp_path / "b.pbin", B, 2)
    bad = tmp_path / "origin.pbin"
    origin_merge([empty, b], bad)
    assert pickle.loads(bad.read_bytes()[12 + 12 :])[0] == (-12, 4)
    assert [d.tolist() for d in modalities.open(bad)] == B


def test_cli_merge(tmp_path: Path) -> None:
    a = make(tmp_path / "a.pbin", A, 2)
    out = tmp_path / "c.pbin"
    run = CliRunner().invoke(
        cli,
        ["merge", str(a), str(DATA / "docs_bpe5k.pbin"), "-o", str(out), "--format", "modalities"],
    )
    assert run.exit_code == 0, run.output
    r = modalities.open(out)
    ref = modalities.open(DATA / "docs_bpe5k.pbin")
    assert len(r) == 303
    assert all(np.array_equal(r[3 + i], ref[i]) for i in range(300))
