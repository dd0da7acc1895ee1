"""Plan-time limits on a filter's size, where the size is what the centre pays for.

The query-set auditor's domain grid (`server/qss/grid.py`) gives every constant a filter uses
its own points, and the grid's work grows with them (issue 41 reported an `in` list of 200
values at 8 s of admission, one of 1 000 values at minutes). A filter that large is refused when it is planned, with
what to change, on the client and again at the server (both run `validation.py`).
"""

from __future__ import annotations

from safeaccess.client.grammar.filters import And, Between, Compare, Filter, In, IsNull, Not, Or

#: Values of one `in` list, and constants of one filter in all (an `in` list's values count one
#: each, a `between` two).
MAX_FILTER_VALUES = 100
#: Conditions (comparisons, `in`, `between`, `is null`) of one filter.
MAX_FILTER_TERMS = 32


def _count(node: Filter) -> tuple[int, int]:
    """(conditions, constants) of a filter."""
    if isinstance(node, Not):
        return _count(node.operand)
    if isinstance(node, And | Or):
        terms = values = 0
        for operand in node.operands:
            t, v = _count(operand)
            terms += t
            values += v
        return terms, values
    if isinstance(node, In):
        return 1, len(node.values)
    if isinstance(node, Between):
        return 1, 2
    if isinstance(node, Compare):
        return 1, 1
    assert isinstance(node, IsNull)
    return 1, 0


def filter_size_problems(node: Filter) -> list[str]:
    """What makes a parsed filter too large to plan (empty when it is within the limits)."""
    problems: list[str] = []
    terms, values = _count(node)
    if terms > MAX_FILTER_TERMS:
        problems.append(
            f"the filter has {terms} conditions; at most {MAX_FILTER_TERMS} are allowed: "
            "combine values of one column into an 'in' list or a 'between' range"
        )
    if values > MAX_FILTER_VALUES:
        problems.append(
            f"the filter uses {values} constant values; at most {MAX_FILTER_VALUES} are allowed "
            "(each value of an 'in' list counts): use a 'between' range or a declared "
            "category instead of a long 'in' list, or split the analysis"
        )
    return problems


__all__ = ["MAX_FILTER_TERMS", "MAX_FILTER_VALUES", "filter_size_problems"]
