"""JSONPath with the semantics of dolma's mixer (jsonpath-rust 0.3), plus jq filters.

What a port has to get right, and jsonpath-ng gets wrong (research notes, section 5):

- ``$.attributes[?(<predicate on @>)]`` where ``attributes`` is an *object* applies the predicate
  to the object itself (on arrays it filters the elements, as usual);
- a filter "matches" when the path yields a non-null value;
- ``==`` is typed: the integer 1 and the float 1.0 differ, and ``>=`` / ``<=`` are ``>`` / ``<``
  *or* ``==``, so ``score >= 1.0`` does not match a score stored as ``1`` (dolma's quirk, kept
  so filters select the same documents); ``<`` and ``>`` compare numbers as floats;
- a bare path in a predicate (``@.k && @.k[0]``) is an existence test.

Supported: ``$``, ``@``, ``.name``, ``['name']``, ``[n]`` (negative from the end), ``[*]``/``.*``,
``[?(...)]`` with ``&& || !`` and parentheses, comparisons ``== != < <= > >=``, ``in``, ``nin``,
``~=`` (regex) and literals (numbers, strings, true, false, null, lists). Evaluation never
mutates the document.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmdata.errors import InvalidInputError

_MISSING = object()

# --------------------------------------------------------------------------------------------
# tokens

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>==|!=|<=|>=|&&|\|\||~=|\.\.|[<>!()\[\]$@.*,?:])
  | (?P<name>[A-Za-z_][\w\-]*)
""",
    re.VERBOSE,
)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise InvalidInputError(
                f"JSONPath {expr!r}: unexpected character at {pos}: {expr[pos : pos + 10]!r}"
            )
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group()))
    return out


def _unquote(s: str) -> str:
    body = s[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


# --------------------------------------------------------------------------------------------
# value semantics


def json_equal(a: Any, b: Any) -> bool:
    """serde_json equality: numbers of different kinds (int / float) are different values."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _less(a: Any, b: Any) -> bool:
    return _num(a) and _num(b) and float(a) < float(b)


def _lt(a: Any, b: Any) -> bool:
    if type(a) is float and type(b) is float:  # the usual filter (a score against a bound)
        return a < b
    return _less(a, b)


def _le(a: Any, b: Any) -> bool:
    if type(a) is float and type(b) is float:
        return a <= b
    return _less(a, b) or json_equal(a, b)


# each operator as a function of (left value, right value), looked up once when compiling
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": json_equal,
    "!=": lambda a, b: not json_equal(a, b),
    "<": _lt,
    ">": lambda a, b: _lt(b, a),
    "<=": _le,
    ">=": lambda a, b: _le(b, a),
    "in": lambda a, b: isinstance(b, list) and any(json_equal(a, x) for x in b),
    "nin": lambda a, b: isinstance(b, list) and not any(json_equal(a, x) for x in b),
    "~=": lambda a, b: isinstance(a, str) and isinstance(b, str) and re.search(b, a) is not None,
}


# --------------------------------------------------------------------------------------------
# compiled paths: a list of steps, each mapping a list of nodes to a list of nodes

Step = Callable[[list[Any], Any], list[Any]]  # (nodes, root) -> nodes


def _child(name: str) -> Step:
    def step(nodes: list[Any], root: Any) -> list[Any]:
        return [n[name] for n in nodes if isinstance(n, dict) and name in n]

    step.plain = (True, name)  # type: ignore[attr-defined]
    return step


def _index(i: int) -> Step:
    def step(nodes: list[Any], root: Any) -> list[Any]:
        out = []
        for n in nodes:
            if isinstance(n, list) and -len(n) <= i < len(n):
                out.append(n[i])
        return out

    step.plain = (False, i)  # type: ignore[attr-defined]
    return step


def _walker(steps: list[Step] | tuple[Step, ...]) -> Callable[[Any], list[Any]] | None:
    """For a path of names and indices only (``@.a.b[0][2]``, the usual filter), a function
    that follows it from one node without building a list per step; None for other paths."""
    plain = [getattr(s, "plain", None) for s in steps]
    if any(p is None for p in plain):
        return None
    chain = tuple(plain)

    def walk(node: Any) -> list[Any]:
        for is_name, k in chain:
            if is_name:
                if not isinstance(node, dict) or k not in node:
                    return []
            elif not isinstance(node, list) or not -len(node) <= k < len(node):
                return []
            node = node[k]
        return [node]

    return walk


def _wildcard(nodes: list[Any], root: Any) -> list[Any]:
    out: list[Any] = []
    for n in nodes:
        if isinstance(n, dict):
            out.extend(n.values())
        elif isinstance(n, list):
            out.extend(n)
    return out


def _descend(nodes: list[Any], root: Any) -> list[Any]:
    out: list[Any] = []
    stack = list(reversed(nodes))
    while stack:
        n = stack.pop()
        out.append(n)
        kids = list(n.values()) if isinstance(n, dict) else n if isinstance(n, list) else []
        stack.extend(reversed(kids))
    return out


def _filter(pred: Callable[[Any, Any], bool]) -> Step:
    def step(nodes: list[Any], root: Any) -> list[Any]:
        out = []
        for n in nodes:
            if isinstance(n, list):
                out.extend(x for x in n if pred(x, root))
            elif pred(n, root):  # dolma's idiom: the predicate applies to the object itself
                out.append(n)
        return out

    return step


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.toks = _tokens(expr)
        self.i = 0

    def error(self, what: str) -> InvalidInputError:
        return InvalidInputError(f"JSONPath {self.expr!r}: {what}")

    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("end", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise self.error(f"expected {value!r}, found {tok[1] or 'the end'!r}")
        self.i += 1
        return tok

    def steps(self) -> list[Step]:
        out: list[Step] = []
        while True:
            val = self.peek()[1]
            if val == "..":
                self.take()
                out.append(_descend)
                if self.peek()[1] not in ("[", "*"):
                    out.append(_child(self.take()[1]))
            elif val == ".":
                self.take()
                k2, v2 = self.take()
                if v2 == "*":
                    out.append(_wildcard)
                elif k2 in ("name", "num"):
                    out.append(_child(v2))
                else:
                    raise self.error(f"expected a name after '.', found {v2!r}")
            elif val == "[":
                self.take()
                out.append(self.bracket())
                self.take("]")
            else:
                return out

    def bracket(self) -> Step:
        kind, val = self.peek()
        if val == "*":
            self.take()
            return _wildcard
        if kind == "num":
            self.take()
            return _index(int(val))
        if kind == "str":
            self.take()
            return _child(_unquote(val))
        if val == "?":
            self.take()
            self.take("(")
            pred = self.or_expr()
            self.take(")")
            return _filter(pred)
        raise self.error(f"unsupported selector [{val}...]")

    def or_expr(self) -> Callable[[Any, Any], bool]:
        left = self.and_expr()
        while self.peek()[1] == "||":
            self.take()
            right = self.and_expr()
            left = (lambda a, b: lambda n, r: a(n, r) or b(n, r))(left, right)
        return left

    def and_expr(self) -> Callable[[Any, Any], bool]:
        left = self.unary()
        while self.peek()[1] == "&&":
            self.take()
            right = self.unary()
            left = (lambda a, b: lambda n, r: a(n, r) and b(n, r))(left, right)
        return left

    def unary(self) -> Callable[[Any, Any], bool]:
        if self.peek()[1] == "!":
            self.take()
            inner = self.unary()
            return lambda n, r: not inner(n, r)
        if self.peek()[1] == "(":
            self.take()
            inner = self.or_expr()
            self.take(")")
            return inner
        left = self.operand()
        kind, op = self.peek()
        if op in ("==", "!=", "<", "<=", ">", ">=", "~=") or (
            kind == "name" and op in ("in", "nin")
        ):
            self.take()
            right = self.operand()

            test = _OPS[op]
            lit = getattr(right, "literal", None)
            if lit is not None:  # the usual filter compares with a constant: take it once
                (b,) = lit

                def compare_literal(n: Any, r: Any) -> bool:
                    for lv in left(n, r):
                        if test(lv, b):
                            return True
                    return False

                return compare_literal

            def compare(n: Any, r: Any, left: Any = left, right: Any = right) -> bool:
                rv = right(n, r)
                if len(rv) != 1:
                    return False
                b = rv[0]
                for lv in left(n, r):
                    if test(lv, b):
                        return True
                return False

            return compare
        return lambda n, r: any(v is not None for v in left(n, r))

    def operand(self) -> Callable[[Any, Any], list[Any]]:
        kind, val = self.take()
        if val in ("@", "$"):
            steps = self.steps()
            current = val == "@"
            walk = _walker(steps)
            if walk is not None:
                return (lambda n, r: walk(n)) if current else (lambda n, r: walk(r))

            def run(n: Any, r: Any) -> list[Any]:
                nodes = [n if current else r]
                for s in steps:
                    nodes = s(nodes, r)
                    if not nodes:
                        break
                return nodes

            return run
        lit = self.literal(kind, val)

        def constant(n: Any, r: Any) -> list[Any]:
            return [lit]

        constant.literal = (lit,)  # type: ignore[attr-defined]
        return constant

    def literal(self, kind: str, val: str) -> Any:
        if kind == "num":
            return float(val) if any(c in val for c in ".eE") else int(val)
        if kind == "str":
            return _unquote(val)
        if kind == "name" and val in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[val]
        if val == "[":
            items = []
            while self.peek()[1] != "]":
                items.append(self.literal(*self.take()))
                if self.peek()[1] == ",":
                    self.take()
            self.take("]")
            return items
        raise self.error(f"unexpected {val!r} where a value was expected")


@dataclass(frozen=True)
class JsonPath:
    """A compiled JSONPath; :meth:`find` lists the values it selects in a document."""

    expr: str
    steps: tuple[Step, ...]

    def find(self, doc: Any) -> list[Any]:
        nodes = [doc]
        for s in self.steps:
            nodes = s(nodes, doc)
            if not nodes:
                return []
        return nodes

    def first(self, doc: Any, default: Any = None) -> Any:
        found = self.find(doc)
        return found[0] if found else default

    def matches(self, doc: Any) -> bool:
        """dolma's filter test: the path selects at least one non-null value."""
        return any(v is not None for v in self.find(doc))


def compile_path(expr: str) -> JsonPath:
    """Parse ``expr`` (errors name the expression and the place)."""
    p = _Parser(expr.strip())
    p.take("$")
    steps = p.steps()
    if p.peek()[0] != "end":
        raise p.error(f"unexpected {p.peek()[1]!r}")
    return JsonPath(expr, tuple(steps))


# --------------------------------------------------------------------------------------------
# jq


def jq_truthy(v: Any) -> bool:
    """Truthiness of a jq filter result in dolma: null, false, 0, "", [] and {} are false."""
    return not (v is None or v is False or (v == 0 and _num(v)) or v in ("", [], {}))


@dataclass(frozen=True)
class JqExpr:
    expr: str

    def _prog(self) -> Any:
        prog = _JQ_CACHE.get(self.expr)
        if prog is None:
            from lmdata._deps import require

            jq = require("jq", f"the jq expression {self.expr!r}")
            try:
                prog = _JQ_CACHE[self.expr] = jq.compile(self.expr)
            except ValueError as e:
                raise InvalidInputError(
                    f"jq expression {self.expr!r} does not compile: {e}"
                ) from None
        return prog

    def first(self, doc: Any, default: Any = None) -> Any:
        out = self._prog().input_value(doc).all()
        return out[0] if out else default

    def matches(self, doc: Any) -> bool:
        return any(jq_truthy(v) for v in self._prog().input_value(doc).all())


_JQ_CACHE: dict[str, Any] = {}


def compile_selector(expr: str, syntax: str = "jsonpath") -> JsonPath | JqExpr:
    if syntax == "jq":
        JqExpr(expr)._prog()
        return JqExpr(expr)
    if syntax != "jsonpath":
        raise InvalidInputError(f"filter syntax {syntax!r}: use jsonpath or jq")
    return compile_path(expr)


# --------------------------------------------------------------------------------------------
# the attribute names an expression reads (to warn of a filter on an attribute never present)

# jq: .attributes.NAME, .attributes["NAME"], .attributes?.NAME
_JQ_ATTRIBUTE = re.compile(
    r"\.attributes\??\s*(?:\.\s*([A-Za-z_][\w\-]*)|\[\s*\"((?:[^\"\\]|\\.)*)\"\s*\])"
)


def attribute_names(expr: str, syntax: str = "jsonpath") -> tuple[str, ...]:
    """The names of the attributes ``expr`` reads directly below ``attributes``, in order:
    ``$.attributes.NAME``, ``$.attributes['NAME']`` and the ``@.NAME`` of dolma's idiom
    ``$.attributes[?(@.NAME ...)]`` (jq: ``.attributes.NAME``, ``.attributes["NAME"]``).
    Empty for an expression that reads none by name (a wildcard, say)."""
    if syntax == "jq":
        found = (a or _unquote(f'"{b}"') for a, b in _JQ_ATTRIBUTE.findall(expr))
        return tuple(dict.fromkeys(found))
    try:
        toks = _tokens(expr)
    except InvalidInputError:
        return ()
    out: list[str] = []
    for i, (kind, val) in enumerate(toks):
        named = kind == "name" and val == "attributes" and i and toks[i - 1][1] in (".", "..")
        quoted = kind == "str" and _unquote(val) == "attributes" and i and toks[i - 1][1] == "["
        if not (named or quoted):
            continue
        j = i + 2 if quoted else i + 1  # past the closing bracket of ['attributes']
        nxt = [t[1] for t in toks[j : j + 3]]
        if nxt[:1] == ["."] and len(nxt) > 1 and toks[j + 1][0] == "name":
            out.append(nxt[1])
        elif nxt[:1] == ["["] and len(nxt) > 1 and toks[j + 1][0] == "str":
            out.append(_unquote(nxt[1]))
        elif nxt[:3] == ["[", "?", "("]:
            out.extend(_filter_names(toks, j + 3))
    return tuple(dict.fromkeys(out))


def _filter_names(toks: list[tuple[str, str]], start: int) -> list[str]:
    """The ``@.NAME`` / ``@['NAME']`` of the filter whose body starts at ``toks[start]`` (not
    those of filters nested in it, which apply to other nodes)."""
    out = []
    parens = brackets = 0  # opened inside the filter; a nested filter is inside brackets
    for k in range(start, len(toks)):
        val = toks[k][1]
        if val == "(":
            parens += 1
        elif val == ")":
            if parens == 0:
                break
            parens -= 1
        elif val == "[":
            brackets += 1
        elif val == "]":
            brackets -= 1
        elif val == "@" and brackets == 0 and k + 2 < len(toks):
            step, key = toks[k + 1], toks[k + 2]
            if step[1] == "." and key[0] == "name":
                out.append(key[1])
            elif step[1] == "[" and key[0] == "str":
                out.append(_unquote(key[1]))
    return out
