"""How a scope's query sets are audited: the mode, the threshold and the span mode's atom cap."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class AuditMode(StrEnum):
    """`atoms`: every atom of the partition holds at least k records (strict, any statistic).
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
        default=100_000,
        ge=1,
        description=(
            "span mode keeps its linear algebra while the partition has at most this many atoms; "
            "above it, it refuses what atoms mode would refuse and says so"
        ),
    )
    small_atom_cap: int = Field(
        default=20_000,
        ge=0,
        description=(
            "span mode searches unions of three among at most this many atoms below k "
            "(the search is quadratic in their number); above it, it refuses what atoms mode "
            "would refuse and says so"
        ),
    )
