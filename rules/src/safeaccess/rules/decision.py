"""Decisions of the output checker. CONTRACT shared with the server and the audit log."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["release", "withhold", "review"]


class Finding(BaseModel):
    """One check that fired, on one cell or item, in words a researcher understands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    check: str = Field(description="Check name, e.g. 'threshold', 'dof', 'nk_dominance'.")
    verdict: Verdict = Field(description="What this finding alone implies.")
    item: str | None = Field(default=None, description="Cell or item, e.g. 'region=North, sex=F'.")
    message: str


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    verdict: Verdict
    findings: list[Finding] = Field(default_factory=list)
    ruleset: str = Field(description="Name and version of the rule set used.")
    ruleset_hash: str = Field(description="SHA-256 of the rule set's canonical content.")


def combine(findings: list[Finding]) -> Verdict:
    """Withhold beats review beats release."""
    verdicts = {f.verdict for f in findings}
    if "withhold" in verdicts:
        return "withhold"
    if "review" in verdicts:
        return "review"
    return "release"
