"""How a scope's query sets are audited: the mode, the threshold and the span mode's cost limits."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class AuditMode(StrEnum):
    """`atoms`: every atom of the partition holds at least k records (strict, any statistic),
    on top of the span audit (so the state keeps its constraints and a repeat only the records
    imply is refused as in span mode: no refusal oracle).
    `span`: no aggregate over fewer than k records is determined by the released linear
    aggregates (admits ordinary overlapping research that `atoms` refuses)."""

    ATOMS = "atoms"
    SPAN = "span"


class AuditPolicy(BaseModel):
    """The audit rule for one dataset. `k` is the rule set's threshold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: AuditMode = AuditMode.SPAN
    k: int = Field(ge=2, description="smallest number of records an isolated set may hold")
    atom_cap: int = Field(
        default=2_000_000,
        ge=1,
        description=(
            "span mode refuses, for cost and under that name, an output that would split the "
            "partition into more atoms than this (never a silent switch to another rule)"
        ),
    )
    search_nodes: int = Field(
        default=400,
        ge=1,
        description=(
            "branches of the exact search run when the rank certificate cannot be completed; "
            "past them the output is refused for cost, under that name"
        ),
    )
