"""Which encoder turns texts into ids, and the checks that it gives the reference's ids.

``hf`` is the reference library of the tokenizer file (Hugging Face ``tokenizers`` for a
``tokenizer.json``, tiktoken for a ``*.tiktoken`` file, sentencepiece for a ``*.model``);
``fast`` is gigatoken (:mod:`lmdata.tokenize.fast`); ``auto`` takes ``fast`` when it is
installed and implements the tokenizer, else ``hf``. The fast encoder is trusted only as far as
it is checked: before a job on :func:`adversarial_sample` and on the job's first documents
(:func:`choose`), and during the job on a deterministic sample of every work unit's documents
(:func:`pick`, :func:`compare`). A disagreement fails a job that asked for ``fast`` and sends
an ``auto`` job back to ``hf``.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError, LmdataError, MissingDependencyError

ENCODERS = ("auto", "fast", "hf")
log = logging.getLogger("lmdata.tokenize")

# the job's first documents checked before it starts (on top of the adversarial sample)
FIRST_DOCS = 64
FIRST_CHARS = 32 << 10
# during the job: about this share of each unit's characters is encoded again by the reference,
# one document (or its first CHECK_MAX_CHARS characters) at least. The reference is 15-70x
# slower per byte than the fast encoder (64x on the bench's 32k BPE): on an 8 MB unit that is
# 2.5 KB checked, about 2% of the unit's encoding time.
CHECK_SHARE = 16384
CHECK_MAX_CHARS = 2048  # a longer document is checked on its first this many characters


@dataclass(frozen=True)
class Choice:
    """The encoder a job uses: its name, the tokenizer workers load, and why (for the log)."""

    encoder: str  # "fast" | "hf" | "bytes"
    asked: str
    note: str = ""  # why auto did not take fast (empty otherwise): a warning
    hint: str = ""  # said at the info level (the fast encoder is not installed)
    tokenizer: Any = field(default=None, compare=False, repr=False)  # the fast one, loaded

    @property
    def label(self) -> str:
        """``fast (gigatoken 0.10.0)``, ``hf (tokenizers)``, as the log line and provenance
        name it."""
        if self.encoder == "fast":
            from lmdata.tokenize.fast import version

            return f"fast (gigatoken {version()})"
        return self.encoder


@dataclass(frozen=True)
class Mismatch:
    """Where the fast encoder and the reference first disagree."""

    index: int  # of the text in the list compared
    position: int  # first differing token (or -1: one of the two refused the text)
    fast: str
    reference: str
    text: str

    def describe(self, where: str) -> str:
        shown = self.text[:60] + ("..." if len(self.text) > 60 else "")
        what = (
            f"token {self.position}: fast {self.fast}, reference {self.reference}"
            if self.position >= 0
            else f"fast {self.fast}, reference {self.reference}"
        )
        return (
            f"the fast encoder's ids differ from the reference's on {where} ({shown!r}) at {what}"
        )


def load_encoder(spec: str, encoder: str) -> Any:
    """The tokenizer of ``spec`` as ``encoder`` ("fast" or "hf"/"bytes": the reference)."""
    from lmdata.tokenize.tokenizers import load_tokenizer

    if encoder == "fast":
        from lmdata.tokenize.fast import load_fast

        return load_fast(spec)
    return load_tokenizer(spec)


def choose(
    spec: str,
    asked: str,
    special_tokens: bool,
    first_texts: Sequence[str] = (),
    reference: Any = None,
    pre: Any = None,
) -> Choice:
    """The encoder for a job on the tokenizer file ``spec`` (loaded already: ``reference``;
    its fast encoder being built: ``pre``, from :func:`lmdata.tokenize.fast.preload`):
    ``asked`` ("auto", "fast", "hf"), checked on the adversarial sample and ``first_texts``. A
    job that asked for ``fast`` fails (InvalidInputError, LmdataError) where ``auto`` falls
    back to ``hf`` with a note."""
    from lmdata.tokenize.tokenizers import ByteTokenizer, load_tokenizer

    if asked not in ENCODERS:
        raise InvalidInputError(f"encoder must be one of {', '.join(ENCODERS)}, got {asked!r}")
    ref = reference if reference is not None else load_tokenizer(spec)
    if (isinstance(ref, ByteTokenizer) or asked == "hf") and pre is not None:
        pre.wait()  # not used; nothing forks while it parses
    if isinstance(ref, ByteTokenizer):
        return Choice("bytes", asked)  # exact and vectorised already
    if asked == "hf":
        return Choice("hf", asked)
    from lmdata.tokenize.fast import Unsupported, load_fast

    try:
        fast = load_fast(spec, ref, pre)
        fast.affixes(special_tokens)
    except (Unsupported, MissingDependencyError) as e:
        if asked == "fast":
            raise InvalidInputError(
                f"--encoder fast cannot encode this tokenizer: {e}; use --encoder auto or hf",
                path=spec,
            ) from None
        if isinstance(e, ImportError):  # the summary line says hf; no warning on every job
            return Choice(
                "hf", asked, "", hint="fast encoder not installed: pip install 'lmdata[fast]'"
            )
        return Choice("hf", asked, f"fast encoder not used: {e}")
    sample = adversarial_sample(ref)
    bad = compare(fast, ref, sample, special_tokens)
    where = f"text {bad.index} of the built-in check sample" if bad else ""
    if bad is None and first_texts:
        bad = compare(fast, ref, first_texts, special_tokens)
        where = f"document {bad.index + 1} of the job" if bad else ""
    if bad is not None:
        message = bad.describe(where)
        if asked == "fast":
            raise LmdataError(f"{message}; pass --encoder hf (or auto)")
        return Choice("hf", asked, f"fast encoder not used: {message}")
    return Choice("fast", asked, tokenizer=fast)


def _ids(tok: Any, texts: Sequence[str], special: bool) -> list[np.ndarray | str]:
    """Each text's ids, or the name of the error its encoder raised on it."""
    try:
        return list(tok.encode_batch(list(texts), add_special_tokens=special))
    except Exception:
        pass
    out: list[np.ndarray | str] = []
    for t in texts:
        try:
            out.append(tok.encode_batch([t], add_special_tokens=special)[0])
        except Exception as e:  # a refusal (a lone surrogate): the other must refuse too
            out.append(f"refuses it ({type(e).__name__})")
    return out


def first_difference(a: np.ndarray, b: np.ndarray) -> int:
    """The first position where ``a`` and ``b`` differ, or -1 when they are equal."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    if len(diff):
        return int(diff[0])
    return -1 if len(a) == len(b) else n


def compare(
    fast: Any,
    ref: Any,
    texts: Sequence[str],
    special: bool,
    got: Sequence[np.ndarray] | None = None,
) -> Mismatch | None:
    """The first text of ``texts`` whose ids differ between ``fast`` and the reference ``ref``
    (``got``: the fast ids already computed), or None."""
    mine = list(got) if got is not None else _ids(fast, texts, special)
    theirs = _ids(ref, texts, special)
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if isinstance(a, str) or isinstance(b, str):
            if isinstance(a, str) and isinstance(b, str):
                continue
            return Mismatch(i, -1, _outcome(a), _outcome(b), texts[i])
        pos = first_difference(a, b)
        if pos >= 0:
            return Mismatch(i, pos, _id_at(a, pos), _id_at(b, pos), texts[i])
    return None


def _outcome(x: np.ndarray | str) -> str:
    return x if isinstance(x, str) else f"gives {len(x)} ids"


def _id_at(x: np.ndarray, pos: int) -> str:
    return str(int(x[pos])) if pos < len(x) else "(end)"


def pick(texts: Sequence[str], allowance: float, salt: int) -> tuple[int, float]:
    """The index of the document of a batch that the reference re-encodes (-1: none), chosen by
    ``salt`` (the unit and batch), and the allowance left: each batch adds its characters /
    CHECK_SHARE to a unit's allowance, and a check spends its document's length. A unit's
    first batch always checks one document (``allowance`` < 0 asks for it)."""
    if not texts:
        return -1, allowance
    first = allowance < 0
    allowance = max(allowance, 0.0) + sum(map(len, texts)) / CHECK_SHARE
    j = zlib.crc32(salt.to_bytes(8, "little")) % len(texts)
    cost = min(len(texts[j]), CHECK_MAX_CHARS)
    if first or cost <= allowance:
        return j, max(allowance - cost, 0.0)
    return -1, allowance


def check_one(fast: Any, text: str, ids: np.ndarray, special: bool) -> Mismatch | None:
    """Compare the fast ids ``ids`` of ``text`` with the reference's (a long text on its
    first CHECK_MAX_CHARS characters, encoded again by both)."""
    if len(text) > CHECK_MAX_CHARS:
        text = text[:CHECK_MAX_CHARS]
        return compare(fast, fast.reference, [text], special)
    return compare(fast, fast.reference, [text], special, got=[ids])


def adversarial_sample(ref: Any = None) -> list[str]:
    """Texts where encoders tend to disagree: the tokenizer's added and special tokens in and
    around text, every byte value and every UTF-8 lead byte, lone surrogates, Unicode
    normalization (NFC/NFKC) edge cases, long runs, whitespace runs, emoji sequences, CJK and
    other scripts, code."""
    specials = _added_tokens(ref)
    lead = "".join(chr(c) for c in (0x80, 0x100, 0x400, 0x7FF, 0x800, 0x3042, 0xFFFD, 0x10000))
    lead += "".join(chr(c) for c in (0x1F600, 0x10FFFF, 0xE000, 0xFFFF))
    out = [
        "",
        "".join(map(chr, range(256))),
        "".join(map(chr, range(0x80, 0x800, 7))) + lead,
        *(chr(b) for b in range(0, 256, 17)),
        "a\ud800b",
        "\udfff",
        "\udc80\udcff text",
        "e\u0301 \u00e9 \ufb01 \u2460 \u212b \u1e9b\u0323 \uff21\uff22 \u1100\u1161 \u0958 \u01c5",
        "\u0041\u030a\u0301 \u00c5 \u0345 \u0344 \u2126 \u1f71 \u0f73 \u0fb6\u0f71\u0f72",
        "a" * 5000,
        "^" * 5000,
        " " * 3000,
        "\n" * 2000,
        "0123456789" * 300,
        "\U0001f642" * 1000,
        "ab" * 2000 + "c",
        "x" * 700 + " " + "y" * 700,
        "a  b   c\t\t d\n\n\n e \r\n f\u00a0g\u2003h\u3000i\u2028j\u2029k\x85l\x0bm\x0cn",
        " " * 17 + "x   \n \n \n\t \t",
        "   leading and trailing   ",
        "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 "
        "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f1ef\U0001f1f5 1\ufe0f\u20e3 "
        "\U0001f44d\U0001f3fd \u2764\ufe0f",
        "日本語のテキスト、中文文本。한국어 텍스트 ｶﾀｶﾅ 𠀀𪚥",
        "العربية עִבְרִית \u200f\u200e हिन्दी ไทย Ελληνικά русский Z̸̧͓̈́a̵l̶g̵o̵",
        "I'm you're he'll we've she'd it's 'S 'LL 'Re O'Neil rock'n'roll",
        "HelloWORLD camelCase snake_case kebab-case SCREAMING_CASE x1y2z3",
        "1234567890 3.14159 -1e-10 1,000,000 0xDEADBEEF 2^64 100% $5.00 #1",
        "\x00\x01\x02\x1f\x7f\x80\x9f \ufeffbom \ufffe\uffff",
        'def f(x):\n    return {"a": [1, 2, 3]}  # comment\n\n\tif x:\n\t\tpass\n',
        '{"key":"value","n":[1,2.5e3,null,true],"nested":{"a":"\\u00e9"}}',
        "function(a,b){return a===b?a:b};var x=1;for(let i=0;i<10;i++){x*=i}",
        '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }\n',
        '<html><body class="x">&amp; &lt;p&gt; <!-- c --></body></html>',
        "https://example.com/path?q=1&r=%20#frag user@example.com",
        "..., !!! ??? --- ___ *** ~~~ ``` ''' \"\"\" ((( ))) [[[ ]]] {{{ }}}",
    ]
    for tok in specials:
        out += [tok, f"a{tok}b", f"{tok}{tok}", f" {tok} ", f"x {tok}\n{tok[:-1]}", tok.upper()]
    return out


def _added_tokens(ref: Any) -> list[str]:
    """The added tokens of a Hugging Face tokenizer (at most 64), or the names that look like
    special tokens for another kind."""
    names: list[str] = []
    inner = getattr(ref, "_tok", None)
    if inner is not None and hasattr(inner, "get_added_tokens_decoder"):
        names = [t.content for _, t in sorted(inner.get_added_tokens_decoder().items())]
    elif ref is not None:
        names = ["<|endoftext|>", "<s>", "</s>", "<unk>", "<pad>"]
    return [n for n in names if n][:64]


def note(choice: Choice) -> None:
    """Say which encoder the job uses (and, when auto fell back, why) on the lmdata.tokenize
    logger; the fallback is a warning, so it shows without any logging set up."""
    if choice.note:
        log.warning("encoder: hf (%s)", choice.note)
    elif choice.hint:
        log.info("encoder: %s (%s)", choice.label, choice.hint)
    else:
        log.info("encoder: %s", choice.label)
