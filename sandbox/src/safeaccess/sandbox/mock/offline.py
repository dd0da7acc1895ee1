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

from safeaccess.client.analyses import Analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.dp_refusal import dp_refusal
from safeaccess.sandbox.mock.data import mock_frame, mock_notes, mock_rows
from safeaccess.sandbox.mock.rehearse_step import DISCLAIMER, refused_step, rehearse_step

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
            steps.append(refused_step(index, analysis.kind, str(exc)))
            continue
        dp = entry.get("dp")
        refused = dp_refusal(
            analysis.kind,
            metadata.name,
            enabled=dp is not None,
            mandatory=bool(dp is not None and dp.get("mandatory")),
        )
        if refused is not None:
            steps.append(refused_step(index, analysis.kind, refused[1]))
            continue
        steps.append(
            rehearse_step(index, analysis, metadata, frame, rs, dp_mock=published_mock is not None)
        )
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


__all__ = ["OFFLINE_NOTE", "rehearse_offline"]
