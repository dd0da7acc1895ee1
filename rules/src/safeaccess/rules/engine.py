"""The output-checking engine: `check(output, ruleset) -> Decision`.

CONTRACT used by the server pipeline: `check(output, ruleset=None, *, history=())`, where
`history` holds the outputs already released earlier to the same researcher on the same dataset
(so checks can see statistics that combine across a sequence). `RuleSet`, `DEFAULT_RULESET` and
`check` stay importable from this module. This first
version carries the two rules the server loop needs (minimum cell count 10, residual df 10); the
rules-engine issue grows it into the full catalogue behind the same signature.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from safeaccess.rules.decision import Decision, Finding, combine
from safeaccess.rules.outputs import (
    Output,
    RegressionOutput,
    ScriptOutput,
    SummaryOutput,
    TableOutput,
)


class RuleSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "default"
    version: str = "1"
    threshold: int = Field(default=10, ge=1)
    dof: int = Field(default=10, ge=0)

    def content_hash(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


DEFAULT_RULESET = RuleSet()


def check(
    output: Output, ruleset: RuleSet | None = None, *, history: Sequence[Output] = ()
) -> Decision:
    """Check one typed output against a rule set and decide release / withhold / review."""
    rs = ruleset or DEFAULT_RULESET
    findings: list[Finding] = []
    if isinstance(output, TableOutput):
        for i, row in enumerate(output.facts.cells.counts):
            for j, n in enumerate(row):
                if 0 < n < rs.threshold:
                    item = _cell_name(output, i, j)
                    findings.append(
                        Finding(
                            check="threshold",
                            verdict="withhold",
                            item=item,
                            message=f"cell {item} rests on {n} records; at least {rs.threshold} are needed",
                        )
                    )
    elif isinstance(output, SummaryOutput):
        for g in output.facts.groups:
            if g.n < rs.threshold:
                findings.append(
                    Finding(
                        check="threshold",
                        verdict="withhold",
                        item=str(g.labels),
                        message=f"group {g.labels} has {g.n} records; at least {rs.threshold} are needed",
                    )
                )
    elif isinstance(output, RegressionOutput):
        if output.facts.df_resid < rs.dof:
            findings.append(
                Finding(
                    check="dof",
                    verdict="withhold",
                    message=f"residual degrees of freedom {output.facts.df_resid:g} < {rs.dof}",
                )
            )
    elif isinstance(output, ScriptOutput):
        findings.append(
            Finding(
                check="script",
                verdict="review",
                message="script output is always checked by a person",
            )
        )
    return Decision(
        verdict=combine(findings),
        findings=findings,
        ruleset=f"{rs.name}@{rs.version}",
        ruleset_hash=rs.content_hash(),
    )


def _cell_name(output: TableOutput, i: int, j: int) -> str:
    parts = [f"{v}={lab}" for v, lab in zip(output.row_vars, output.row_labels[i], strict=False)]
    if j < len(output.col_labels):
        parts += [
            f"{v}={lab}" for v, lab in zip(output.col_vars, output.col_labels[j], strict=False)
        ]
    return ", ".join(parts) or "total"
