"""Your budgets on a dataset, as the catalogue states them: differential privacy and withholds.

`session.budgets("census")` returns both; `session.seal(plan)` refuses (before anything is
signed) a plan whose DP requests the remaining DP budget cannot cover, saying what remains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from safeaccess.client.results import WithholdBudget


@dataclass(frozen=True)
class DPBudget:
    """The privacy budget of your scope (your own, your project's or the dataset's) on one
    dataset: every DP answer charged to the scope spends from it."""

    scope: str
    epsilon: float
    delta: float
    epsilon_spent: float
    epsilon_remaining: float
    releases: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DPBudget:
        return cls(
            scope=str(data["scope"]),
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            epsilon_spent=float(data["epsilon_spent"]),
            epsilon_remaining=float(data["epsilon_remaining"]),
            releases=int(data["releases"]),
        )

    def __str__(self) -> str:
        return (
            f"DP budget of this {self.scope}: ε = {self.epsilon_spent:.4g} spent of "
            f"{self.epsilon:g} at δ = {self.delta:g} ({self.releases} answers); one more request "
            f"may ask for at most ε = {self.epsilon_remaining:.4g}"
        )


@dataclass(frozen=True)
class Budgets:
    """What you may still spend on one dataset; None where the centre sets no such budget."""

    dataset: str
    dp: DPBudget | None
    withhold: WithholdBudget | None

    @classmethod
    def from_catalogue(cls, entry: dict[str, Any]) -> Budgets:
        dp = entry.get("dp_budget")
        withhold = entry.get("withhold_budget")
        return cls(
            dataset=f"{entry['name']}@{entry['version']}",
            dp=DPBudget.from_json(dp) if dp else None,
            withhold=WithholdBudget(**withhold) if withhold else None,
        )

    def __str__(self) -> str:
        lines = [f"budgets on {self.dataset}:"]
        lines.append(f"  {self.dp}" if self.dp else "  no differential privacy on this dataset")
        lines.append(f"  {self.withhold}" if self.withhold else "  no withhold budget")
        return "\n".join(lines)


__all__ = ["Budgets", "DPBudget"]
