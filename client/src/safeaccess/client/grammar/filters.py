"""The filter (`where`) grammar: AST, parser and renderer.

    filter     := or_expr
    or_expr    := and_expr ('or' and_expr)*
    and_expr   := not_expr ('and' not_expr)*
    not_expr   := 'not' not_expr | '(' filter ')' | predicate
    column     := name | ('year' | 'month' | 'day') '(' name ')'
    predicate  := column cmp literal | literal cmp column
                | column ['not'] 'in' '(' literal (',' literal)* ')'
                | column ['not'] 'between' literal 'and' literal
                | column 'is' ['not'] 'null'
    cmp        := '=' | '==' | '!=' | '<>' | '<' | '<=' | '>' | '>='
    literal    := ['-'] number | 'string' | "string" | true | false

Keywords are case-insensitive and reserved (a column cannot be called `and`, `in`, ...). A quote
inside a string is written twice, as in SQL: 'O''Brien'. `year(admitted)`, `month(admitted)` and
`day(admitted)` are the parts of a date column as integers (`safeaccess.client.dateparts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from safeaccess.client.dateparts import DATE_PARTS, part_name
from safeaccess.client.grammar._parser import Cursor
from safeaccess.client.grammar.errors import GrammarError
from safeaccess.client.grammar.lexer import Token

Scalar: TypeAlias = bool | int | float | str
CompareOp = Literal["==", "!=", "<", "<=", ">", ">="]

KEYWORDS = frozenset({"and", "or", "not", "in", "between", "is", "null", "true", "false"})
_OP_ALIASES: dict[str, CompareOp] = {
    "=": "==",
    "==": "==",
    "!=": "!=",
    "<>": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
# Swapping the sides of a comparison: `18 <= age` is `age >= 18`.
_FLIPPED: dict[CompareOp, CompareOp] = {
    "==": "==",
    "!=": "!=",
    "<": ">",
    "<=": ">=",
    ">": "<",
    ">=": "<=",
}


@dataclass(frozen=True, slots=True)
class Compare:
    """`column op value`."""

    column: str
    op: CompareOp
    value: Scalar


@dataclass(frozen=True, slots=True)
class In:
    """`column in (v1, v2, ...)`, or `not in` when `negated`."""

    column: str
    values: tuple[Scalar, ...]
    negated: bool = False

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("an 'in' list needs at least one value")


@dataclass(frozen=True, slots=True)
class Between:
    """`column between low and high` (both ends inclusive), or `not between` when `negated`."""

    column: str
    low: Scalar
    high: Scalar
    negated: bool = False


@dataclass(frozen=True, slots=True)
class IsNull:
    """`column is null`, or `is not null` when `negated`."""

    column: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class And:
    """All operands hold (two or more; nested groups stay nested as written)."""

    operands: tuple[Filter, ...]

    def __post_init__(self) -> None:
        if len(self.operands) < 2:
            raise ValueError("And needs at least two operands")


@dataclass(frozen=True, slots=True)
class Or:
    """At least one operand holds (two or more)."""

    operands: tuple[Filter, ...]

    def __post_init__(self) -> None:
        if len(self.operands) < 2:
            raise ValueError("Or needs at least two operands")


@dataclass(frozen=True, slots=True)
class Not:
    """The operand does not hold."""

    operand: Filter


Predicate: TypeAlias = Compare | In | Between | IsNull
Filter: TypeAlias = Compare | In | Between | IsNull | And | Or | Not


def literal_kind(value: Scalar) -> str:
    """'boolean', 'number' or 'string': the kinds that may be mixed in one `in` list or range."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string"


# ---------------------------------------------------------------------------------------- parsing


def parse_filter(text: str) -> Filter:
    """Parse a `where` filter. Raises `GrammarError` naming the offending token."""
    cur = Cursor(text, "filter")
    if cur.current.kind == "eof":
        raise cur.error("the filter is empty; leave 'where' out to keep all rows")
    node = _or(cur)
    if cur.current.kind != "eof":
        raise cur.error(
            f"unexpected {cur.current.describe()} after a complete condition; "
            "join conditions with 'and' / 'or'"
        )
    return node


def _or(cur: Cursor) -> Filter:
    operands = [_and(cur)]
    while cur.is_keyword("or"):
        cur.advance()
        operands.append(_and(cur))
    return operands[0] if len(operands) == 1 else Or(tuple(operands))


def _and(cur: Cursor) -> Filter:
    operands = [_not(cur)]
    while cur.is_keyword("and"):
        cur.advance()
        operands.append(_not(cur))
    return operands[0] if len(operands) == 1 else And(tuple(operands))


def _not(cur: Cursor) -> Filter:
    if cur.is_keyword("not"):
        cur.advance()
        cur.enter()
        operand = _not(cur)
        cur.leave()
        return Not(operand)
    if cur.is_op("("):
        cur.advance()
        cur.enter()
        if cur.is_op(")"):
            raise cur.error("empty parentheses: put a condition inside")
        node = _or(cur)
        cur.leave()
        cur.expect_op(")", "to close the parenthesis")
        return node
    return _predicate(cur)


def _column(cur: Cursor) -> str:
    tok = cur.current
    if tok.kind != "ident":
        raise cur.error(f"expected a column name, found {tok.describe()}")
    if tok.text.lower() in KEYWORDS:
        raise cur.error(f"{tok.text!r} is a reserved word, not a column name")
    cur.advance()
    if cur.is_op("("):
        return _date_part(cur, tok)
    return tok.text


def _date_part(cur: Cursor, func: Token) -> str:
    """`year(admitted)` after its function name: the part's canonical name (a date part is
    compared as the integer it is, e.g. `year(admitted) >= 2020`)."""
    parts = ", ".join(f"{p}()" for p in DATE_PARTS)
    if func.text not in DATE_PARTS:
        raise cur.error(
            f"unknown function {func.text!r}; a filter compares columns and the parts of a "
            f"date column: {parts}",
            func,
        )
    cur.advance()  # '('
    tok = cur.current
    if tok.kind != "ident" or tok.text.lower() in KEYWORDS:
        raise cur.error(f"{func.text}() takes one date column, found {tok.describe()}")
    cur.advance()
    cur.expect_op(")", f"to close {func.text}(")
    return part_name(func.text, tok.text)


def _starts_literal(cur: Cursor) -> bool:
    tok = cur.current
    if tok.kind in ("number", "string"):
        return True
    if tok.kind == "op" and tok.text == "-":
        return cur.peek().kind == "number"
    return tok.kind == "ident" and tok.text.lower() in ("true", "false", "null")


def _literal(cur: Cursor, context: str) -> Scalar:
    tok = cur.current
    if tok.kind == "op" and tok.text == "-":
        cur.advance()
        num = cur.current
        if num.kind != "number":
            raise cur.error(f"expected a number after '-' {context}, found {num.describe()}")
        cur.advance()
        assert isinstance(num.value, int | float)
        return -num.value
    if tok.kind in ("number", "string"):
        cur.advance()
        assert tok.value is not None
        return tok.value
    if tok.kind == "ident":
        word = tok.text.lower()
        if word in ("true", "false"):
            cur.advance()
            return word == "true"
        if word == "null":
            raise cur.error("null is not a value: write 'column is null' or 'column is not null'")
    raise cur.error(
        f"expected a value (a number, a quoted string, true or false) {context}, "
        f"found {tok.describe()}"
    )


def _compare_op(cur: Cursor) -> CompareOp | None:
    tok = cur.current
    if tok.kind == "op" and tok.text in _OP_ALIASES:
        cur.advance()
        return _OP_ALIASES[tok.text]
    return None


def _predicate(cur: Cursor) -> Predicate:
    if _starts_literal(cur):
        # `18 <= age`: a literal on the left is turned around.
        value = _literal(cur, "on the left of a comparison")
        op_tok = cur.current
        op = _compare_op(cur)
        if op is None:
            raise cur.error(
                f"expected a comparison operator after a value, found {op_tok.describe()}"
            )
        column = _column(cur)
        return Compare(column, _FLIPPED[op], value)
    column = _column(cur)
    op = _compare_op(cur)
    if op is not None:
        return Compare(column, op, _literal(cur, f"to compare {column!r} with"))
    negated = False
    not_tok: Token | None = None
    if cur.is_keyword("not"):
        not_tok = cur.advance()
        negated = True
    if cur.is_keyword("in"):
        cur.advance()
        return In(column, _in_list(cur, column), negated)
    if cur.is_keyword("between"):
        between_tok = cur.advance()
        low = _literal(cur, "as the lower end of 'between'")
        if not cur.is_keyword("and"):
            raise cur.error(f"expected 'and' in 'between', found {cur.current.describe()}")
        cur.advance()
        high = _literal(cur, "as the upper end of 'between'")
        if literal_kind(low) != literal_kind(high):
            raise cur.error(
                f"'between' needs two values of the same kind, got a {literal_kind(low)} "
                f"and a {literal_kind(high)}",
                between_tok,
            )
        return Between(column, low, high, negated)
    if not_tok is not None:
        raise cur.error(f"expected 'in' or 'between' after 'not', found {cur.current.describe()}")
    if cur.is_keyword("is"):
        cur.advance()
        is_not = False
        if cur.is_keyword("not"):
            cur.advance()
            is_not = True
        if not cur.is_keyword("null"):
            raise cur.error(f"expected 'null' after 'is', found {cur.current.describe()}")
        cur.advance()
        return IsNull(column, is_not)
    raise cur.error(
        f"expected a comparison (=, !=, <, <=, >, >=), 'in', 'between' or 'is null' after "
        f"column {column!r}, found {cur.current.describe()}"
    )


def _in_list(cur: Cursor, column: str) -> tuple[Scalar, ...]:
    open_tok = cur.expect_op("(", "after 'in'")
    values = [_literal(cur, f"in the list for {column!r}")]
    while cur.is_op(","):
        cur.advance()
        values.append(_literal(cur, f"in the list for {column!r}"))
    cur.expect_op(")", "to close the 'in' list")
    kinds = {literal_kind(v) for v in values}
    if len(kinds) > 1:
        raise cur.error(
            f"the 'in' list for {column!r} mixes {' and '.join(sorted(kinds))} values; "
            "use values of one kind",
            open_tok,
        )
    return tuple(values)


# -------------------------------------------------------------------------------------- rendering


def render_literal(value: Scalar) -> str:
    """A literal as filter text: true/false, repr of numbers, single-quoted strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + value.replace("'", "''") + "'"


def render_filter(node: Filter) -> str:
    """Render a filter AST as text that `parse_filter` turns back into an equal AST."""
    if isinstance(node, Compare):
        return f"{node.column} {node.op} {render_literal(node.value)}"
    if isinstance(node, In):
        values = ", ".join(render_literal(v) for v in node.values)
        return f"{node.column} {'not in' if node.negated else 'in'} ({values})"
    if isinstance(node, Between):
        word = "not between" if node.negated else "between"
        return f"{node.column} {word} {render_literal(node.low)} and {render_literal(node.high)}"
    if isinstance(node, IsNull):
        return f"{node.column} is {'not null' if node.negated else 'null'}"
    if isinstance(node, Not):
        inner = render_filter(node.operand)
        return f"not ({inner})" if isinstance(node.operand, And | Or) else f"not {inner}"
    if isinstance(node, And):
        return " and ".join(
            f"({render_filter(o)})" if isinstance(o, And | Or) else render_filter(o)
            for o in node.operands
        )
    if isinstance(node, Or):
        return " or ".join(
            f"({render_filter(o)})" if isinstance(o, Or) else render_filter(o)
            for o in node.operands
        )
    raise TypeError(f"not a filter node: {type(node).__name__}")


def filter_columns(node: Filter) -> set[str]:
    """The column names a filter refers to."""
    if isinstance(node, Compare | In | Between | IsNull):
        return {node.column}
    if isinstance(node, Not):
        return filter_columns(node.operand)
    out: set[str] = set()
    for operand in node.operands:
        out |= filter_columns(operand)
    return out


__all__ = [
    "KEYWORDS",
    "And",
    "Between",
    "Compare",
    "CompareOp",
    "Filter",
    "GrammarError",
    "In",
    "IsNull",
    "Not",
    "Or",
    "Predicate",
    "Scalar",
    "filter_columns",
    "literal_kind",
    "parse_filter",
    "render_filter",
    "render_literal",
]
