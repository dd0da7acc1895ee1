"""`AnalysisInvalid`: the one error a researcher gets for an analysis that cannot run, with each
problem's field and what to do, whether the schema, the grammar or the metadata found it.

Pydantic's own messages name error types and documentation URLs; `problems_from` turns them into
plain sentences a researcher can act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an analysis: the field (e.g. 'rows[1]', 'where') and what to do."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class AnalysisInvalid(ValueError):
    """An analysis that cannot run on this dataset; `problems` lists every reason found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"the analysis is not valid for this dataset:\n{lines}")


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _allowed(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the (possibly nested) model an unknown field was given to."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or not isinstance(part, str) or part not in fields:
            return []
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return sorted(n for n in fields if n != "kind") if fields else []


def _message(err: Any, model: type[BaseModel] | None) -> str:
    kind = err["type"]
    if kind == "missing":
        return "this field is required; give it"
    if kind == "extra_forbidden":
        allowed = _allowed(model, tuple(err["loc"]))
        hint = f"; the fields are {', '.join(allowed)}" if allowed else ""
        return f"unknown field{hint}"
    message = str(err["msg"])
    # Our own validators' messages, without pydantic's "Value error, " prefix.
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if kind.startswith(("literal_error", "enum")):
        return message.replace("Input should be", "must be")
    return message[:1].lower() + message[1:] if message[:2] != message[:2].upper() else message


def problems_from(exc: ValidationError, model: type[BaseModel] | None = None) -> list[Problem]:
    """Plain problems for a pydantic error (no error codes or documentation links)."""
    name = model.__name__ if model is not None else "analysis"
    return [
        Problem(_field(tuple(err["loc"])) or name, _message(err, model))
        for err in exc.errors(include_url=False)
    ]


__all__ = ["AnalysisInvalid", "Problem", "problems_from"]
