"""Which columns of the dataset an analysis reads.

Parquet is columnar, so the runner reads only these: a frequency table of two variables at 10 M
records reads two columns (plus the filter's), not the whole file. Scripts, and anything this
module cannot account for, read every column the sandbox copy holds.
"""

from __future__ import annotations

from safeaccess.client.analyses import Analysis, Script
from safeaccess.client.dateparts import parse_part
from safeaccess.client.grammar import GrammarError, columns_of, parse_filter, parse_formula
from safeaccess.client.metadata import DatasetMetadata

# Analysis fields that name columns (a single name or a list of names).
_COLUMN_FIELDS = (
    "rows",
    "cols",
    "value",
    "variables",
    "variable",
    "by",
    "group",
    "time",
    "event",
    "target",
    "features",
    "columns",
)


def needed_columns(analysis: Analysis, metadata: DatasetMetadata) -> list[str] | None:
    """The declared columns `analysis` uses, in metadata order; None means read them all."""
    if isinstance(analysis, Script):
        return None
    names: set[str] = set()
    for field in _COLUMN_FIELDS:
        value = getattr(analysis, field, None)
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, list):
            names.update(v for v in value if isinstance(v, str))
    fairness = getattr(analysis, "fairness", None)
    protected = getattr(fairness, "protected", None)
    if isinstance(protected, str):
        names.add(protected)
    try:
        if analysis.where is not None and analysis.where.strip():
            names |= columns_of(parse_filter(analysis.where))
        formula = getattr(analysis, "formula", None)
        if isinstance(formula, str):
            names |= columns_of(parse_formula(formula))
    except GrammarError:
        return None  # the filter or formula reports its own error when it is applied
    for name in list(names):
        parsed = parse_part(name) if "(" in name else None
        if parsed is not None:  # `year(admitted)` reads `admitted`
            names.add(parsed[1])
    contributor = metadata.contributor_column
    if contributor is not None:
        names.add(contributor)
    declared = [c.name for c in metadata.columns if c.name in names]
    return declared or None
