"""The model-formula grammar: AST, parser (with term expansion) and renderer.

A Wilkinson–Rogers formula in the patsy/R style, restricted to what can be checked and computed
without evaluating code:

    formula   := response '~' sum
    response  := numeric
    sum       := ['+' | '-'] product (('+' | '-') product)*
    product   := interact ('*' interact)*
    interact  := atom (':' atom)*
    atom      := '(' sum ')' | '1' | '0' | factor
    factor    := 'C' '(' column ')' | numeric
    numeric   := column | FUNC '(' numeric ')' | 'I' '(' numeric '**' INTEGER ')'
    FUNC      := log | log1p | exp | sqrt | abs          (INTEGER: 2 to 10)

`a*b` is `a + b + a:b`; `- 1` or `+ 0` removes the intercept (`+ 1` puts it back); `- term`
removes a term. Terms are sets of factors (`a:b` is `b:a`); the expanded term list keeps the
order of first appearance.
Powers are written `I(x ** 2)` (the statsmodels spelling), never evaluated: only an integer
exponent is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from safeaccess.client.grammar._parser import Cursor
from safeaccess.client.grammar.errors import GrammarError

TransformName = Literal["log", "log1p", "exp", "sqrt", "abs"]
TRANSFORMS: tuple[TransformName, ...] = ("log", "log1p", "exp", "sqrt", "abs")
MIN_POWER, MAX_POWER = 2, 10


@dataclass(frozen=True, slots=True)
class Var:
    """A column used as it is (numeric, or categorical when the metadata says so)."""

    name: str


@dataclass(frozen=True, slots=True)
class Call:
    """A whitelisted transform of a numeric expression, e.g. `log(income)`."""

    func: TransformName
    arg: Numeric


@dataclass(frozen=True, slots=True)
class Power:
    """`I(base ** exponent)` with an integer exponent between 2 and 10."""

    base: Numeric
    exponent: int

    def __post_init__(self) -> None:
        if isinstance(self.exponent, bool) or not MIN_POWER <= self.exponent <= MAX_POWER:
            raise ValueError(f"power exponent must be an integer from {MIN_POWER} to {MAX_POWER}")


@dataclass(frozen=True, slots=True)
class Categorical:
    """`C(column)`: the column is treatment-coded, whatever its type."""

    column: str


Numeric: TypeAlias = Var | Call | Power
Factor: TypeAlias = Var | Call | Power | Categorical
Term: TypeAlias = tuple[Factor, ...]


@dataclass(frozen=True, slots=True)
class Formula:
    """A parsed formula: the response, the expanded right-hand-side terms and the intercept flag."""

    response: Numeric
    terms: tuple[Term, ...]
    intercept: bool = True

    def __post_init__(self) -> None:
        seen: set[frozenset[Factor]] = set()
        for term in self.terms:
            key = frozenset(term)
            if not term or len(key) != len(term):
                raise ValueError("each term needs one or more distinct factors")
            if key in seen:
                raise ValueError(f"term {term_name(term)!r} appears twice")
            seen.add(key)
        if not self.terms and not self.intercept:
            raise ValueError("a formula needs an intercept or at least one term")

    @property
    def response_name(self) -> str:
        return factor_name(self.response)

    @property
    def term_names(self) -> list[str]:
        return [term_name(t) for t in self.terms]


def factor_name(f: Factor) -> str:
    """A factor as formula text, e.g. 'C(sex)', 'log(income)', 'I(age ** 2)'."""
    if isinstance(f, Var):
        return f.name
    if isinstance(f, Categorical):
        return f"C({f.column})"
    if isinstance(f, Call):
        return f"{f.func}({factor_name(f.arg)})"
    return f"I({factor_name(f.base)} ** {f.exponent})"


def term_name(term: Term) -> str:
    """A term as formula text, its factors joined by ':'."""
    return ":".join(factor_name(f) for f in term)


def factor_column(f: Factor) -> str:
    """The one column a factor is computed from."""
    if isinstance(f, Var):
        return f.name
    if isinstance(f, Categorical):
        return f.column
    if isinstance(f, Call):
        return factor_column(f.arg)
    return factor_column(f.base)


def formula_columns(formula: Formula) -> set[str]:
    """Every column a formula refers to, the response's included."""
    cols = {factor_column(formula.response)}
    for term in formula.terms:
        cols.update(factor_column(f) for f in term)
    return cols


def render_formula(formula: Formula) -> str:
    """Render a formula as text that `parse_formula` turns back into an equal Formula."""
    rhs = " + ".join(term_name(t) for t in formula.terms)
    if not formula.terms:
        rhs = "1"
    elif not formula.intercept:
        rhs += " - 1"
    return f"{factor_name(formula.response)} ~ {rhs}"


# ---------------------------------------------------------------------------------------- parsing


@dataclass
class _Expr:
    """An intermediate right-hand side: terms in order, intercept None (unsaid) / True / False."""

    terms: list[Term] = field(default_factory=list)
    intercept: bool | None = None

    def keys(self) -> set[frozenset[Factor]]:
        return {frozenset(t) for t in self.terms}


def _union(terms: list[Term], more: list[Term]) -> list[Term]:
    out = list(terms)
    keys = {frozenset(t) for t in out}
    for t in more:
        if frozenset(t) not in keys:
            keys.add(frozenset(t))
            out.append(t)
    return out


def _plus(a: _Expr, b: _Expr) -> _Expr:
    return _Expr(_union(a.terms, b.terms), b.intercept if b.intercept is not None else a.intercept)


def _minus(a: _Expr, b: _Expr) -> _Expr:
    # As in patsy: subtracting 1 removes the intercept; subtracting 0 changes nothing.
    drop = b.keys()
    intercept = False if b.intercept is True else a.intercept
    return _Expr([t for t in a.terms if frozenset(t) not in drop], intercept)


def _interact(a: _Expr, b: _Expr, cur: Cursor, op_tok_pos: int) -> _Expr:
    if a.intercept is not None or b.intercept is not None:
        raise GrammarError(
            "1 and 0 (the intercept) cannot take part in an interaction", op_tok_pos, ":", cur.text
        )
    terms: list[Term] = []
    for ta in a.terms:
        for tb in b.terms:
            terms = _union(terms, [ta + tuple(f for f in tb if f not in ta)])
    return _Expr(terms, None)


def parse_formula(text: str) -> Formula:
    """Parse a model formula and expand its terms. Raises `GrammarError` naming the token."""
    cur = Cursor(text, "formula")
    if cur.current.kind == "eof":
        raise cur.error("the formula is empty; write e.g. 'income ~ age + C(sex)'")
    if cur.is_op("~"):
        raise cur.error("the formula needs a response before '~', e.g. 'income ~ age'")
    response = _numeric(cur, "as the response")
    if not cur.is_op("~"):
        raise cur.error(
            f"expected '~' after the response, found {cur.current.describe()}; "
            "write e.g. 'income ~ age'"
        )
    tilde = cur.advance()
    if cur.current.kind == "eof":
        raise cur.error("nothing after '~': name the explanatory terms, or 1 for the mean only")
    expr = _sum(cur)
    if cur.current.kind != "eof":
        raise cur.error(f"unexpected {cur.current.describe()}; join terms with '+'")
    intercept = True if expr.intercept is None else expr.intercept
    if not expr.terms and not intercept:
        raise GrammarError("the formula has no regressors and no intercept", tilde.pos, "~", text)
    return Formula(response, tuple(expr.terms), intercept)


def _sum(cur: Cursor) -> _Expr:
    if cur.is_op("+"):
        cur.advance()
        expr = _product(cur)
    elif cur.is_op("-"):
        minus_tok = cur.advance()
        operand = _product(cur)
        if operand.terms:
            raise cur.error(
                "a leading '-' can only remove the intercept ('-1'); there is nothing "
                "before it to remove terms from",
                minus_tok,
            )
        expr = _minus(_Expr(), operand)
    else:
        expr = _product(cur)
    while cur.is_op("+", "-"):
        op = cur.advance().text
        right = _product(cur)
        expr = _plus(expr, right) if op == "+" else _minus(expr, right)
    return expr


def _product(cur: Cursor) -> _Expr:
    expr = _interaction(cur)
    while cur.is_op("*"):
        tok = cur.advance()
        right = _interaction(cur)
        expr = _plus(_plus(expr, right), _interact(expr, right, cur, tok.pos))
    return expr


def _interaction(cur: Cursor) -> _Expr:
    expr = _atom(cur)
    while cur.is_op(":"):
        tok = cur.advance()
        expr = _interact(expr, _atom(cur), cur, tok.pos)
    return expr


def _atom(cur: Cursor) -> _Expr:
    tok = cur.current
    if cur.is_op("("):
        cur.advance()
        cur.enter()
        if cur.is_op(")"):
            raise cur.error("empty parentheses: put terms inside")
        expr = _sum(cur)
        cur.leave()
        cur.expect_op(")", "to close the parenthesis")
        return expr
    if tok.kind == "number":
        if tok.value == 1 and not isinstance(tok.value, float):
            cur.advance()
            return _Expr([], True)
        if tok.value == 0 and not isinstance(tok.value, float):
            cur.advance()
            return _Expr([], False)
        raise cur.error(
            f"the number {tok.text} cannot be a term; only 1 (intercept) and 0 (no intercept) can"
        )
    if (
        tok.kind == "ident"
        and tok.text == "C"
        and cur.peek().kind == "op"
        and cur.peek().text == "("
    ):
        return _Expr([(_categorical(cur),)], None)
    return _Expr([(_numeric(cur, "as a term"),)], None)


def _categorical(cur: Cursor) -> Categorical:
    cur.advance()  # 'C'
    cur.expect_op("(", "after C")
    tok = cur.current
    if tok.kind != "ident" or (cur.peek().kind == "op" and cur.peek().text == "("):
        raise cur.error(f"C() takes one column name, found {tok.describe()}")
    cur.advance()
    if not cur.is_op(")"):
        raise cur.error(
            f"C() takes exactly one column name; found {cur.current.describe()} "
            "(the first declared or sorted level is the reference)"
        )
    cur.advance()
    return Categorical(tok.text)


def _numeric(cur: Cursor, context: str) -> Numeric:
    tok = cur.current
    if tok.kind != "ident":
        raise cur.error(f"expected a column or a transform {context}, found {tok.describe()}")
    cur.advance()
    if not cur.is_op("("):
        return Var(tok.text)
    if tok.text == "C":
        raise cur.error(
            "C() marks a categorical term; it cannot be the response or transformed", tok
        )
    if tok.text != "I" and tok.text not in TRANSFORMS:
        raise cur.error(
            f"unknown function {tok.text!r}; allowed: C(), I(x ** k), "
            + ", ".join(f"{t}()" for t in TRANSFORMS),
            tok,
        )
    cur.advance()  # '('
    cur.enter()
    inner = _numeric(cur, f"inside {tok.text}()")
    result: Numeric
    if tok.text == "I":
        if not cur.is_op("**"):
            raise cur.error(
                f"I() only takes a power, e.g. I(x ** 2); found {cur.current.describe()}"
            )
        cur.advance()
        exp_tok = cur.current
        if (
            exp_tok.kind != "number"
            or not isinstance(exp_tok.value, int)
            or not MIN_POWER <= exp_tok.value <= MAX_POWER
        ):
            raise cur.error(
                f"the exponent in I() must be an integer from {MIN_POWER} to {MAX_POWER}, "
                f"found {exp_tok.describe()}"
            )
        cur.advance()
        result = Power(inner, exp_tok.value)
    else:
        func: TransformName = next(t for t in TRANSFORMS if t == tok.text)
        result = Call(func, inner)
    cur.leave()
    cur.expect_op(")", f"to close {tok.text}(")
    return result


__all__ = [
    "MAX_POWER",
    "MIN_POWER",
    "TRANSFORMS",
    "Call",
    "Categorical",
    "Factor",
    "Formula",
    "Numeric",
    "Power",
    "Term",
    "TransformName",
    "Var",
    "factor_column",
    "factor_name",
    "formula_columns",
    "parse_formula",
    "render_formula",
    "term_name",
]
