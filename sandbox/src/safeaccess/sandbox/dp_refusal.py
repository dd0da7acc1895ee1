"""What a dataset's DP setting refuses whatever the data: a DP kind where DP is off, a
rule-checked kind where DP is mandatory.

One implementation for the real step and plan check (`safeaccess.server.dp.refusal`) and the
offline rehearsal (`safeaccess.sandbox.mock.offline`), so both say the same words.
"""

from __future__ import annotations

from safeaccess.client.analyses import DP_KINDS, SYNTH_KINDS


def dp_refusal(
    kind: str, dataset: str, *, enabled: bool, mandatory: bool
) -> tuple[str, str] | None:
    """(error code, message) when `kind` may not run on `dataset`, else None."""
    noised = DP_KINDS | SYNTH_KINDS
    if kind in noised and not enabled:
        return (
            "dp_not_enabled",
            f"dataset {dataset!r} does not answer differentially private kinds ({kind}); its "
            "controller has not enabled DP on it. Use the rule-checked kinds instead.",
        )
    if kind not in noised and enabled and mandatory:
        return (
            "dp_required",
            f"dataset {dataset!r} answers only differentially private kinds "
            f"({', '.join(sorted(noised))}); {kind} is refused on it.",
        )
    return None
