"""The analysis language's grammar: `where` filters and model formulas.

Hand-written recursive-descent parsers; nothing a researcher writes is ever evaluated as code
(patsy formulas can run arbitrary Python, so patsy is not used). Every error is a `GrammarError`
pointing at the offending token.
"""

from __future__ import annotations

from safeaccess.client.grammar.errors import MAX_DEPTH, MAX_LENGTH, GrammarError
from safeaccess.client.grammar.filters import (
    And,
    Between,
    Compare,
    CompareOp,
    Filter,
    In,
    IsNull,
    Not,
    Or,
    Scalar,
    filter_columns,
    parse_filter,
    render_filter,
)
from safeaccess.client.grammar.formulas import (
    TRANSFORMS,
    Call,
    Categorical,
    Factor,
    Formula,
    Numeric,
    Power,
    Term,
    Var,
    factor_column,
    factor_name,
    formula_columns,
    parse_formula,
    render_formula,
    term_name,
)


def columns_of(ast: Filter | Formula) -> set[str]:
    """The column names a parsed filter or formula refers to."""
    if isinstance(ast, Formula):
        return formula_columns(ast)
    return filter_columns(ast)


__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "TRANSFORMS",
    "And",
    "Between",
    "Call",
    "Categorical",
    "Compare",
    "CompareOp",
    "Factor",
    "Filter",
    "Formula",
    "GrammarError",
    "In",
    "IsNull",
    "Not",
    "Numeric",
    "Or",
    "Power",
    "Scalar",
    "Term",
    "Var",
    "columns_of",
    "factor_column",
    "factor_name",
    "parse_filter",
    "parse_formula",
    "render_filter",
    "render_formula",
    "term_name",
]
