"""Rehearse a plan on the researcher's machine when the centre cannot be reached.

`plan.rehearse()` asks the centre first (`safeaccess.server.steps.rehearsal`). Without it, the
client hands this module what it cached at its last connection: the catalogue entry (metadata,
published row count, the output rule set in force with its hash, the DP setting) and, when the
controller published one, the signed DP mock. The same checks then run here, in the same order:
the analysis against the metadata, the DP setting's refusals, a model's parameter limits, the
runner's compute code on a mock, the mitigations asked for and the dataset's own output rules.

The mock is the published DP mock when there is one, else the mock the centre would draw from
the metadata and row count alone (`safeaccess.sandbox.mock.data`: same seed, same values). What
an offline rehearsal cannot do is said in the report: the DP budget is the centre's to count,
so DP requests are checked against it only when the plan is sealed.

The answer is a dict shaped as the centre's rehearsal answer, with `offline` and `mock_source`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from safeaccess.client.analyses import DP_KINDS, SYNTH_KINDS, Analysis, ModelTraining
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.checks.models import param_problems
from safeaccess.rules.checks.models import release_view as model_release_view
from safeaccess.rules.engine import check
from safeaccess.rules.mitigation import mitigate
from safeaccess.rules.outputs import ModelOutput, Output
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import RunnerRequest
from safeaccess.sandbox.failures import DECIDABLE_RUNNER_CODES
from safeaccess.sandbox.mock.data import mock_frame, mock_notes, mock_rows
from safeaccess.sandbox.runner import run_request

DISCLAIMER = (
    "A rehearsal on a mock predicts nothing about the real verdicts: the mock has the declared "
    "columns, levels, bounds and row count but values drawn uniformly and independently, so "
    "real cells, groups and fits differ. Only what is refused by the analysis alone is certain."
)
DP_MOCK_DISCLAIMER = (
    "A rehearsal on a mock predicts nothing about the real verdicts: the published DP mock is "
    "synthetic data with noise added, so real cells, groups and fits differ. Only what is "
    "refused by the analysis alone is certain."
)
OFFLINE_NOTE = (
    "OFFLINE: the centre could not be reached; rehearsed here with the catalogue and rules "
    "cached at the last connection. DP requests are checked against your DP budget only when "
    "you seal."
)


def dp_refusal(kind: str, dp: dict[str, Any] | None, dataset: str) -> str | None:
    """What the dataset's DP setting refuses whatever the data (as the centre says it)."""
    if (kind in DP_KINDS or kind in SYNTH_KINDS) and dp is None:
        return (
            f"dataset {dataset!r} does not answer differentially private kinds ({kind}); its "
            "controller has not enabled DP on it. Use the rule-checked kinds instead."
        )
    if kind not in DP_KINDS | SYNTH_KINDS and dp is not None and dp.get("mandatory"):
        return (
            f"dataset {dataset!r} answers only differentially private kinds "
            f"({', '.join(sorted(DP_KINDS | SYNTH_KINDS))}); {kind} is refused on it."
        )
    return None


def _mitigated(output: Output, analysis: Analysis, rs: RuleSet) -> Output:
    """The output as it would be released: mitigations asked for, a model's release view."""
    if isinstance(output, ModelOutput):
        return model_release_view(output, rs)
    mitigations = getattr(analysis, "mitigations", None)
    if mitigations is None or (mitigations.round_to is None and not mitigations.suppress):
        return output
    result: Output = mitigate(
        output, rs, round_to=mitigations.round_to, suppress=mitigations.suppress
    )
    return result


def _step(
    index: int,
    analysis: Analysis,
    metadata: DatasetMetadata,
    frame: pd.DataFrame,
    rs: RuleSet,
) -> dict[str, Any]:
    kind = analysis.kind
    step: dict[str, Any] = {"index": index, "kind": kind, "refused": [], "checks": []}
    if isinstance(analysis, ModelTraining):
        broken = param_problems(
            analysis.family, analysis.params.model_dump(), len(analysis.features), rs
        )
        if broken:
            return {**step, "refused": list(broken), "mock_verdict": "failed"}
    if kind == "script":
        note = "a script is not run on the mock; its output always goes to an output checker"
        return {**step, "mock_verdict": "not_rehearsed", "note": note}
    if kind in DP_KINDS:
        note = (
            "a DP answer is protected by its noise, not by output rules; only its budget is "
            "checked before sealing"
        )
        return {**step, "mock_verdict": "not_rehearsed", "note": note}
    request = RunnerRequest(
        analysis=analysis.model_dump(mode="json"),
        metadata=metadata.model_dump(mode="json"),
        dataset_path="mock",
    )
    response = run_request(request, frame)
    if not response.ok or response.output is None:
        error = response.error
        code = error.code if error is not None else "analysis_failed"
        message = error.message if error is not None else "no output"
        if code not in DECIDABLE_RUNNER_CODES:
            note = (
                f"on the mock the computation failed ({code}: {message}); on real data such a "
                "failure is a withhold"
            )
            return {**step, "mock_verdict": "withhold", "note": note}
        return {**step, "refused": [message], "mock_verdict": "failed"}
    decision = check(_mitigated(response.output, analysis, rs), rs)
    checks = [
        {"check": f.check, "verdict": f.verdict, "item": f.item, "message": f.message}
        for f in decision.findings
        if f.verdict != "release"
    ]
    return {**step, "mock_verdict": decision.verdict, "checks": checks}


def rehearse_offline(
    analyses: list[Analysis],
    entry: dict[str, Any],
    published_mock: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """Rehearse `analyses` on the dataset of catalogue `entry` (as cached by the client), on
    `published_mock` when given, else on the mock drawn from the metadata and row count."""
    metadata = DatasetMetadata.model_validate(
        {
            "name": entry["name"],
            "version": int(entry["version"]),
            "description": entry.get("description", ""),
            "columns": entry["columns"],
        }
    )
    rules = {k: v for k, v in dict(entry["rules"]).items() if k != "sha256"}
    rs = RuleSet.model_validate(rules)
    if rs.content_hash() != entry["rules"].get("sha256"):
        raise ValueError("the cached rule set does not match its hash; connect to the centre")
    rows = int(entry["rows"])
    if published_mock is not None:
        frame = published_mock.reset_index(drop=True)
        source = "published DP mock"
        notes = [f"the published DP mock has {len(frame)} rows"]
        disclaimer = DP_MOCK_DISCLAIMER
    else:
        frame = mock_frame(metadata, rows, int(entry["version"]))
        source = "mock from the published metadata and row count"
        notes = mock_notes(metadata, rows)
        disclaimer = DISCLAIMER
    steps = []
    for index, analysis in enumerate(analyses):
        try:
            validate(analysis, metadata)
        except AnalysisInvalid as exc:
            steps.append(
                {
                    "index": index,
                    "kind": analysis.kind,
                    "refused": [str(exc)],
                    "mock_verdict": "failed",
                    "checks": [],
                }
            )
            continue
        refused = dp_refusal(analysis.kind, entry.get("dp"), metadata.name)
        if refused is not None:
            steps.append(
                {
                    "index": index,
                    "kind": analysis.kind,
                    "refused": [refused],
                    "mock_verdict": "failed",
                    "checks": [],
                }
            )
            continue
        steps.append(_step(index, analysis, metadata, frame, rs))
    return {
        "dataset": metadata.name,
        "version": metadata.version,
        "rows": rows,
        "mock_rows": len(frame) if published_mock is not None else mock_rows(rows),
        "ruleset": rs.label,
        "notes": notes,
        "disclaimer": disclaimer,
        "steps": steps,
        "offline": True,
        "mock_source": source,
    }


__all__ = ["OFFLINE_NOTE", "dp_refusal", "rehearse_offline"]
