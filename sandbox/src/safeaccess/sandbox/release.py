"""The output as it would be released, before the output rules look at it.

One implementation for the real step (`safeaccess.server.steps.pipeline`) and for both
rehearsals (the centre's and the offline one in `safeaccess.sandbox.mock.rehearse_step`): a
rehearsal that mitigated differently from the real step would predict another verdict.
"""

from __future__ import annotations

from safeaccess.client.analyses import Analysis
from safeaccess.rules.checks.models import release_view as model_release_view
from safeaccess.rules.checks.regression import regression_release_view
from safeaccess.rules.missing import suppress_small_missing
from safeaccess.rules.mitigation import mitigate
from safeaccess.rules.outputs import ModelOutput, Output, RegressionOutput
from safeaccess.rules.ruleset import RuleSet


def mitigate_output(output: Output, analysis: Analysis, ruleset: RuleSet) -> Output:
    """The output as it would be released: mitigations asked for, a model's or a regression's
    release view. Missing counts below the threshold are suppressed whatever was asked
    (`safeaccess.rules.missing`)."""
    output = suppress_small_missing(output, ruleset)
    if isinstance(output, ModelOutput):
        return model_release_view(output, ruleset)
    if isinstance(output, RegressionOutput):
        return regression_release_view(output, ruleset)
    mitigations = getattr(analysis, "mitigations", None)
    if mitigations is None or (mitigations.round_to is None and not mitigations.suppress):
        return output
    result: Output = mitigate(
        output, ruleset, round_to=mitigations.round_to, suppress=mitigations.suppress
    )
    return result
