"""The `synth_*` rules: from the check facts to release / review / withhold.

A pure function of the facts and the rule parameters. The facts depend on the real records, so
only the verdict (and the rule that decided it) goes to the researcher; the facts go to output
checkers and the audit log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from safeaccess.rules.synthetic.attack import AttackRow
from safeaccess.rules.synthetic.coverage import SampledCoverage
from safeaccess.rules.synthetic.distance import DcrReport
from safeaccess.rules.synthetic.errors import SyntheticCheckError
from safeaccess.rules.synthetic.synthpop import UniquesExcess

Action = Literal["release", "review", "withhold"]
_SEVERITY: dict[str, int] = {"release": 0, "review": 1, "withhold": 2}
# DCR: a closer-than-real share must also be significant (one-sided binomial z) to fire
_DCR_Z = 3.0
# small data: an upper bound at the withhold level is reason enough to look
_SMALL_N = 500
# the quantile of the real LOO distances that `synth_yp_y: loo_q05` names
LOO_QUANTILE = 0.05


@dataclass(frozen=True)
class SynthRules:
    """The rule-set parameters of the synthetic-data check (design defaults)."""

    synth_attack_excess_withhold: float = 0.05
    synth_attack_excess_review: float = 0.02
    synth_certain_correct_withhold: float = 0.05
    synth_full_row_uniques_review: float = 0.01
    synth_full_row_uniques_withhold: float = 0.03
    synth_dcr_close_review: float = 0.02
    synth_dcr_close_withhold: float = 0.05
    synth_yp_y: str | float = "loo_q05"
    synth_yp_p: float = 0.10
    synth_p_privacy_tau: float = 0.9
    synth_max_keysets: int = 20
    synth_max_cells: int = 100_000
    synth_max_model_cells: int = 10_000_000
    synth_max_rows: int = 1_000_000
    synth_hungarian_max: int = 5000
    synth_action_on_check_error: Action = "review"

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> SynthRules:
        """The defaults with `settings` (e.g. the `synth_*` keys of a rule-set file) applied;
        an unknown key or a value of the wrong type is named in the error."""
        base = cls()
        known = {f.name: type(getattr(base, f.name)) for f in fields(cls)}
        for key, value in settings.items():
            if key not in known:
                raise SyntheticCheckError(
                    f"unknown setting {key!r}; allowed settings are {', '.join(known)}"
                )
            if key == "synth_yp_y":
                ok = value == "loo_q05" or (_is_number(value) and value >= 0)
            elif known[key] is float:
                ok = _is_number(value) and value >= 0
            elif known[key] is int:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            else:
                ok = isinstance(value, str)
            if not ok:
                raise SyntheticCheckError(f"{key}: {value!r} is not a valid value")
        return replace(base, **dict(settings))

    def __post_init__(self) -> None:
        if self.synth_attack_excess_review > self.synth_attack_excess_withhold:
            raise SyntheticCheckError("synth_attack_excess_review must not exceed _withhold")
        if self.synth_full_row_uniques_review > self.synth_full_row_uniques_withhold:
            raise SyntheticCheckError("synth_full_row_uniques_review must not exceed _withhold")
        if self.synth_dcr_close_review > self.synth_dcr_close_withhold:
            raise SyntheticCheckError("synth_dcr_close_review must not exceed _withhold")
        if self.synth_action_on_check_error not in ("review", "withhold"):
            raise SyntheticCheckError(
                "synth_action_on_check_error must be 'review' or 'withhold' (never release)"
            )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class RuleOutcome:
    rule: str
    action: Action
    detail: str


@dataclass(frozen=True)
class SynthVerdict:
    """The most severe action over the rules that fired, and every rule that fired."""

    action: Action
    outcomes: tuple[RuleOutcome, ...] = field(default_factory=tuple)


def decide(
    rules: SynthRules,
    *,
    attack: Sequence[AttackRow] = (),
    uniques: UniquesExcess | None = None,
    dcr: DcrReport | None = None,
    coverage: SampledCoverage | None = None,
    check_error: str | None = None,
) -> SynthVerdict:
    """Apply the `synth_*` rules to the check facts; a check that could not run (`check_error`)
    gives `synth_action_on_check_error`, never release."""
    out: list[RuleOutcome] = []
    if check_error is not None:
        out.append(
            RuleOutcome(
                "synth_action_on_check_error", rules.synth_action_on_check_error, check_error
            )
        )
    for row in attack:
        ex = row.excess
        where = f"target {row.target}, keys {list(row.keys)}: excess {ex.estimate:+.4f} [{ex.low:+.4f}, {ex.high:+.4f}]"
        if ex.estimate >= rules.synth_attack_excess_withhold and ex.low > 0:
            out.append(RuleOutcome("synth_attack_excess_withhold", "withhold", where))
        elif (ex.estimate >= rules.synth_attack_excess_review and ex.low > 0) or (
            ex.high >= rules.synth_attack_excess_withhold and row.n_real < _SMALL_N
        ):
            out.append(RuleOutcome("synth_attack_excess_review", "review", where))
        if row.certain_correct_excess >= rules.synth_certain_correct_withhold:
            out.append(
                RuleOutcome(
                    "synth_certain_correct_withhold",
                    "withhold",
                    f"target {row.target}, keys {list(row.keys)}: certain-correct excess "
                    f"{row.certain_correct_excess:+.4f}",
                )
            )
    if uniques is not None:
        ex = uniques.excess
        detail = (
            f"{uniques.uniques} rows unique within a half of O: S reproduces {uniques.syn_share:.4f}, "
            f"the other half {uniques.ref_share:.4f}, excess {ex.estimate:+.4f} "
            f"[{ex.low:+.4f}, {ex.high:+.4f}]"
        )
        if ex.estimate >= rules.synth_full_row_uniques_withhold and ex.low > 0:
            out.append(RuleOutcome("synth_full_row_uniques_withhold", "withhold", detail))
        elif ex.estimate >= rules.synth_full_row_uniques_review and ex.low > 0:
            out.append(RuleOutcome("synth_full_row_uniques_review", "review", detail))
    if dcr is not None:
        gap = dcr.p_syn - dcr.p_ref
        detail = f"p_syn {dcr.p_syn:.4f} - p_ref {dcr.p_ref:.4f} = {gap:+.4f} (z {dcr.z:.2f})"
        if gap >= rules.synth_dcr_close_withhold and dcr.z > _DCR_Z:
            out.append(RuleOutcome("synth_dcr_close_withhold", "withhold", detail))
        elif gap >= rules.synth_dcr_close_review and dcr.z > _DCR_Z:
            out.append(RuleOutcome("synth_dcr_close_review", "review", detail))
    if coverage is not None:
        # With y at the LOO quantile and ties there (coded categories: distance 0 between equal
        # rows), more than the quantile's share of real records lie within y of another one; p
        # is raised by that surplus, so that the real records would pass their own rule.
        p = rules.synth_yp_p
        if dcr is not None and rules.synth_yp_y == "loo_q05":
            p += max(0.0, dcr.p_ref - LOO_QUANTILE)
        if coverage.p_prime_mean > p:
            out.append(
                RuleOutcome(
                    "synth_yp_p",
                    "review",
                    f"mean p' {coverage.p_prime_mean:.4f} > p {p:.4f} on samples of {coverage.m}",
                )
            )
    action: Action = "release"
    for o in out:
        if _SEVERITY[o.action] > _SEVERITY[action]:
            action = o.action
    return SynthVerdict(action, tuple(out))
