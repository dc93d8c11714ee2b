"""The typed description of a tokenize job and of what it did."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmdata import formats
from lmdata.errors import InvalidInputError
from lmdata.formats import FormatSpec, TokenTarget
from lmdata.formats._spec import check_writer_options


@dataclass(frozen=True)
class TokenizeJob:
    """Everything that decides the output bytes (also recorded for ``resume``)."""

    to: str
    tokenizer: str = "bytes"
    text_key: str = "text"
    batch_docs: int = 256
    validation_fraction: float = 0.0
    skip_invalid: bool = False
    eod: str | None = None
    eod_id: int | None = None
    append_eod: bool | None = None
    # None: the target's convention (Modalities: the tokenizer's post-processor, as the
    # origin calls it with the HF default; the others: ids of the text only)
    add_special_tokens: bool | None = None
    source_format: str | None = None
    writer_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        target = formats.spec(self.to)
        if target.tokens is None:
            raise InvalidInputError(
                f"cannot tokenize into {self.to!r}; token formats: "
                f"{', '.join(formats.token_targets())}"
            )
        object.__setattr__(self, "to", target.name)  # an alias becomes the format's name
        check_writer_options(target, self.writer_options, "lmdata.tokenize")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise InvalidInputError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        if self.batch_docs < 1:
            raise InvalidInputError(f"batch_docs must be positive, got {self.batch_docs}")

    @property
    def spec(self) -> FormatSpec:
        return formats.spec(self.to)

    @property
    def target(self) -> TokenTarget:
        target = self.spec.tokens
        assert target is not None  # checked in __post_init__
        return target

    @property
    def special_tokens(self) -> bool:
        """Whether the tokenizer adds its special tokens: ``add_special_tokens``, else the
        target's convention."""
        if self.add_special_tokens is None:
            return self.target.special_tokens
        return self.add_special_tokens


@dataclass
class Summary:
    """What a job did; ``documents_read == documents_written + documents_skipped``."""

    documents_read: int = 0
    documents_written: int = 0
    documents_skipped: int = 0
    tokens: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    output: str = ""
    encoder: str = ""  # what encoded: "fast (gigatoken 0.10.0)", "hf", "bytes"

    def line(self) -> str:
        rate = self.tokens / self.seconds / 1e6 if self.seconds else 0.0
        return (
            f"documents read {self.documents_read:,}, written {self.documents_written:,}, "
            f"skipped {self.documents_skipped:,}; {self.tokens:,} tokens in "
            f"{self.seconds:.2f} s ({rate:.1f} Mtok/s) -> {self.output}"
            + (f" (encoder {self.encoder})" if self.encoder else "")
        )
