"""Reconstruction risk of univariate statistics (Derrick, Green, Ritchie & White, PSD 2022).

How many samples on an ordinal or small-integer scale are consistent with released means,
SDs, medians, quantiles, minima and maxima; whether they pin down every value or a small
frequency cell; and the output check the rules engine runs on summary outputs.
"""

from safeaccess.rules.reconstruction._exact import (
    Admissible,
    ReconstructionError,
    quantile_weights,
    round_half_even,
    round_sqrt_half_even,
)
from safeaccess.rules.reconstruction.check import reconstruction_findings
from safeaccess.rules.reconstruction.matching import (
    BudgetExceeded,
    MatchResult,
    OrderConstraint,
    SampleConstraints,
    analyse,
    count_consistent,
    count_matching_samples,
    exists_consistent,
    matching_frequency_bounds,
)
from safeaccess.rules.reconstruction.samples import count_unique_samples, sample_space_size

__all__ = [
    "Admissible",
    "BudgetExceeded",
    "MatchResult",
    "OrderConstraint",
    "ReconstructionError",
    "SampleConstraints",
    "analyse",
    "count_consistent",
    "count_matching_samples",
    "count_unique_samples",
    "exists_consistent",
    "matching_frequency_bounds",
    "quantile_weights",
    "reconstruction_findings",
    "round_half_even",
    "round_sqrt_half_even",
    "sample_space_size",
]
