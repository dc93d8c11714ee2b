"""dolma's JSONPath semantics (jsonpath-rust 0.3) and jq filters."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.dolma.jsonpath import compile_path, compile_selector, json_equal
from lmdata.errors import InvalidInputError

DOC = {
    "id": "d",
    "text": "t",
    "metadata": {"url": "u", "n": None},
    "attributes": {
        "r": [[0, 5, 0.3]],
        "dup": [[0, 50, 1]],
        "empty": [],
        "flt": [[0, 1, 1.0]],
        "scalar": 0.7,
    },
}


@pytest.mark.parametrize(
    "expr, want",
    [
        # the idiom: a predicate on the attributes *object*
        ("$.attributes[?(@.r[0][2] < 0.9)]", True),
        ("$.attributes[?(@.r[0][2] < 0.2)]", False),
        ("$.attributes[?(@.r[0][2] >= 0.3)]", True),
        # typed equality: int 1 is not float 1.0, and >= is "> or ==" (dolma's quirk)
        ("$.attributes[?(@.dup[0][2] >= 1.0)]", False),
        ("$.attributes[?(@.dup[0][2] >= 1)]", True),
        ("$.attributes[?(@.dup[0][2] > 0.5)]", True),
        ("$.attributes[?(@.flt[0][2] == 1)]", False),
        ("$.attributes[?(@.flt[0][2] <= 1.0)]", True),
        # missing keys and empty span lists never match; existence guards
        ("$.attributes[?(@.missing[0][2] > 0.5)]", False),
        ("$.attributes[?(@.missing[0][2] < 0.5)]", False),
        ("$.attributes[?(@.empty && @.empty[0] && @.empty[0][2] > 0.5)]", False),
        ("$.attributes[?(@.dup && @.dup[0] && @.dup[0][2] > 0.5)]", True),
        ("$.attributes[?(!(@.missing) && @.scalar > 0.5)]", True),
        ("$.attributes[?(@.r[0][2] > 0.5 || @.scalar == 0.7)]", True),
        ("$.metadata[?(@.url == 'u')]", True),
        ("$.metadata[?(@.url in ['a', 'u'])]", True),
        ("$.metadata[?(@.url ~= '^u$')]", True),
        # plain paths match when the value exists and is not null
        ("$.metadata.url", True),
        ("$.metadata.n", False),
        ("$.metadata.nope", False),
        ("$.attributes.empty", True),
    ],
)
def test_matches(expr: str, want: bool) -> None:
    before = copy.deepcopy(DOC)
    assert compile_path(expr).matches(DOC) is want
    assert DOC == before  # jsonpath-ng mutates its input; this must not


def test_find_and_selectors() -> None:
    assert compile_path("$.attributes.dup").first(DOC) == [[0, 50, 1]]
    assert compile_path("$['metadata']['url']").first(DOC) == "u"
    assert compile_path("$.attributes.r[-1][2]").first(DOC) == 0.3
    assert compile_path("$.attributes.r[*][1]").find(DOC) == [5]
    assert compile_path("$..url").find(DOC) == ["u"]
    assert compile_path("$.attributes.r[?(@[2] > 0.1)]").find(DOC) == [[0, 5, 0.3]]


def test_json_equal_is_typed() -> None:
    assert not json_equal(1, 1.0) and not json_equal(True, 1) and json_equal([1, "a"], [1, "a"])


@pytest.mark.parametrize("bad", ["attributes.x", "$.a[?(@.b <)]", "$.a[?(@.b > 1]", "$.a b"])
def test_syntax_errors_name_the_expression(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="JSONPath"):
        compile_path(bad)


def test_jq_truthiness() -> None:
    sel = compile_selector(".attributes.r[0][2] < 0.5", "jq")
    assert sel.matches(DOC)
    assert not compile_selector(".attributes.empty", "jq").matches(DOC)  # [] is false
    assert not compile_selector(".attributes.missing", "jq").matches(DOC)
    assert compile_selector(".attributes.dup | length > 0", "jq").matches(DOC)
    with pytest.raises(InvalidInputError, match="does not compile"):
        compile_selector(".a[", "jq")


_VALUES = st.one_of(
    st.floats(allow_nan=True),
    st.integers(-(2**60), 2**60),
    st.booleans(),
    st.none(),
    st.sampled_from([0.5, 1.0, 1, 2**53 + 1, float(2**53)]),
)


@settings(max_examples=400, deadline=None)
@given(a=_VALUES, b=_VALUES)
def test_comparisons_are_dolmas_rules_whatever_the_fast_path(a: object, b: object) -> None:
    # the float fast path must give the general rule: < is numeric on both sides,
    # <= and >= are "< or typed ==" (so int 1 >= float 1.0 is false), NaN compares false
    from lmdata.dolma.jsonpath import _OPS

    def less(x: object, y: object) -> bool:
        num = (int, float)
        ok = all(isinstance(v, num) and not isinstance(v, bool) for v in (x, y))
        return ok and float(x) < float(y)  # type: ignore[arg-type]

    assert _OPS["<"](a, b) == less(a, b)
    assert _OPS[">"](a, b) == less(b, a)
    assert _OPS["<="](a, b) == (less(a, b) or json_equal(a, b))
    assert _OPS[">="](a, b) == (less(b, a) or json_equal(a, b))


_JSON = st.recursive(
    st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), st.none(), st.sampled_from("ab")),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.sampled_from("abc"), kids, max_size=3)
    ),
    max_leaves=12,
)
_STEP = st.one_of(
    st.sampled_from([".a", ".b", ".c", "['b']"]), st.integers(-3, 3).map("[{}]".format)
)


@settings(max_examples=300, deadline=None)
@given(doc=_JSON, path=st.lists(_STEP, min_size=1, max_size=4), lit=st.integers(-3, 3))
def test_plain_paths_in_filters_agree_with_the_general_steps(
    doc: object, path: list[str], lit: int
) -> None:
    # a filter's names-and-indices path is walked without a list per step (and a constant
    # right side is taken once): the same values and verdicts as the step-by-step evaluation
    from lmdata.dolma.jsonpath import _OPS, _walker

    expr = "$" + "".join(path)
    walk = _walker(compile_path(expr).steps)
    assert walk is not None
    assert walk(doc) == compile_path(expr).find(doc)
    nodes = doc if isinstance(doc, list) else [doc]
    for op in ("==", ">=", "<"):
        fast = compile_path(f"$[?(@{''.join(path)} {op} {lit})]").matches(doc)
        slow = any(any(_OPS[op](v, lit) for v in compile_path(expr).find(n)) for n in nodes)
        assert fast == slow
