"""The demo's words: what its columns and its last line say they show."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdata.demo import run


@pytest.fixture(scope="module")
def demo_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    lines: list[str] = []
    out = Path(tmp_path_factory.mktemp("demo"))
    run(out, limit=12, steps=1, seq_len=256, batch_size=4, workers=0, log=lines.append)
    return "\n".join(lines)


def test_bytes_per_token_is_called_bytes(demo_text: str) -> None:
    explained = next(x for x in demo_text.splitlines() if x.strip().startswith("B/token "))
    assert "bytes on disk per token" in explained
    assert "MB per token" not in demo_text


def test_the_last_row_names_its_dataset(demo_text: str) -> None:
    (line,) = [x for x in demo_text.splitlines() if x.startswith("first row of step 0")]
    assert "of a Loader over stdlib.flat-tokens (train split" in line
    assert "rows of 256 tokens" in line and "seed 1234" in line
    assert line.split(" starts: ", 1)[1].startswith("'")  # the row's text follows
