"""A dataset's differential-privacy configuration, as the controller sets it.

`epsilon`/`delta` is the total budget of one ledger; `scope` says whose releases share a ledger
(each researcher, each project, or everyone on the dataset); `mandatory` refuses rule-checked
kinds on the dataset; `max_tpr_at_5pct` caps what one release may give an attacker telling
neighbouring datasets apart (its TPR at FPR 0.05).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from safeaccess.client.analyses import SYNTH_MAX_EPSILON

Scope = Literal["researcher", "project", "dataset"]


class DPConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # up to the largest synthetic-data request, so that a budget can cover it (the bound only
    # catches typos; each kind's own request bound still applies)
    epsilon: float = Field(gt=0.0, le=SYNTH_MAX_EPSILON, allow_inf_nan=False)
    delta: float = Field(gt=0.0, lt=1.0)
    scope: Scope = "researcher"
    mandatory: bool = False
    max_tpr_at_5pct: float | None = Field(
        default=None,
        gt=0.05,
        le=1.0,
        description="Largest TPR at FPR 0.05 one release may allow (above 0.05, which is "
        "blind guessing).",
    )


def ledger_key(dataset: str, scope: Scope, *, researcher: str, project: str) -> tuple[str, str]:
    """(ledger key, owner) of the scope a step of `researcher` in `project` is charged to."""
    owner = {"researcher": researcher, "project": project, "dataset": dataset}[scope]
    return f"{dataset}|{scope}|{owner}", owner
