"""Rule sets: versioned, content-hashed YAML parameters for the output checks.

A rule set names every parameter the checks use (thresholds, dominance rules, how zeros, missing
and negative values are treated). Its SHA-256 content hash is recorded with every decision so an
auditor can tell exactly which parameters decided a release.

Per-dataset overrides are small YAML files holding only the keys that differ (e.g. Eustat's
threshold of 3 for population tables); they are applied on top of a base rule set with
`load_ruleset(text, base=DEFAULT_RULESET)` or `RuleSet.with_overrides(mapping)`.

Invalid files raise `RuleSetError` naming the offending key and its line, taken from the YAML
node marks, so an administrator can fix the file without guessing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if TYPE_CHECKING:
    from safeaccess.rules.synthetic.decision import SynthRules


class RuleSetError(ValueError):
    """A rule set file or override is invalid; `key` and `line` (1-based) locate the problem."""

    def __init__(self, message: str, *, key: str | None = None, line: int | None = None) -> None:
        where = []
        if line is not None:
            where.append(f"line {line}")
        if key is not None:
            where.append(f"key '{key}'")
        prefix = f"rule set {', '.join(where)}: " if where else "rule set: "
        super().__init__(prefix + message)
        self.key = key
        self.line = line


class WithholdBudget(BaseModel):
    """How many withholds a researcher may receive on one dataset (every version) within a
    rolling window before new sequences on it need an output checker's approval to open.

    Every withhold tells a researcher one bit about the data (the result was disclosive), and
    sequences are otherwise unlimited; the budget bounds the bits per window."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    count: int = Field(ge=1, description="Withholds allowed within the window.")
    days: int = Field(ge=1, le=3650, description="Length of the rolling window in days.")


class RuleSet(BaseModel):
    """All parameters of the output checks. Frozen: derive variants with `with_overrides`."""

    # strict: a YAML `threshold: yes` must not quietly become 1, nor `zeros_disclosive: 0` False
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(default="default", min_length=1)
    version: str = Field(default="1", min_length=1)
    description: str = ""
    threshold: int = Field(
        default=10, ge=1, description="Minimum records or contributor units per released number."
    )
    dof: int = Field(default=10, ge=0, description="Minimum residual degrees of freedom.")
    nk_n: int = Field(
        default=2, ge=1, le=3, description="N of the N-K dominance rule (facts keep the top 3)."
    )
    nk_k: float = Field(default=0.9, gt=0.0, le=1.0, description="K of the N-K dominance rule.")
    p_ratio: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="Withhold when (total-top1-top2)/top1 < p."
    )
    spread_n: int = Field(
        default=2,
        ge=1,
        le=3,
        description="Records whose joint share of a released spread statistic is limited "
        "(facts keep the top 3).",
    )
    spread_k: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Withhold an sd/variance (skewness, kurtosis) when the spread_n records "
        "farthest from the mean hold at least this share of sum |y - mean|^r.",
    )
    max_quantiles: int = Field(
        default=19,
        ge=1,
        description="Most quantiles one summary may ask for (19: every 5 %).",
    )
    zeros_disclosive: bool = Field(default=True, description="Empty cells are disclosive.")
    class_disclosure: float | None = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Largest share of a row or column one cell may hold; None disables the check.",
    )
    missing_values: Literal["ignore", "review"] = Field(
        default="ignore", description="What to do with cells whose value had missing records."
    )
    negative_values: Literal["review", "withhold"] = Field(
        default="review", description="Verdict when dominance is undefined (negative values)."
    )
    extremes: Literal["withhold", "review"] = Field(
        default="withhold", description="Verdict for raw minima and maxima."
    )
    survival_threshold: int = Field(
        default=10, ge=1, description="Minimum at-risk records and events per survival step."
    )
    reconstruction: bool = Field(
        default=True, description="Run exact reconstruction-risk checks on summary statistics."
    )
    reconstruction_max_states: int = Field(
        default=200_000,
        ge=1,
        description="Search states the reconstruction check may explore before it sends the "
        "output to review instead of guessing.",
    )
    reconstruction_time_budget: float = Field(
        default=2.0, gt=0.0, description="Seconds the reconstruction check may spend per output."
    )

    withhold_budget: WithholdBudget | None = Field(
        default=WithholdBudget(count=25, days=30),
        description="Withholds per researcher and dataset name within a window before opening a "
        "sequence needs an output checker's approval; None disables the budget.",
    )

    leverage_limit: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="Largest leverage (hat value) a model may give any record; None means "
        "1/threshold, the leverage of a record in a saturated cell of `threshold` records; 1.0 "
        "turns the check off.",
    )

    model_mia_auc_limit: float = Field(
        default=0.6,
        ge=0.5,
        le=1.0,
        description="Trained models: largest membership-inference AUC (loss attack and "
        "worst-case attack, on the real training vs test records) a released model may allow; "
        "1.0 turns the check off.",
    )
    model_fairness_limit: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Trained models with a fairness report: largest demographic parity or "
        "equalised odds difference before `model_fairness_action` applies; None: report only.",
    )
    model_fairness_action: Literal["report", "review", "withhold"] = Field(
        default="report", description="What a fairness difference above the limit does."
    )
    model_max_depth: int | None = Field(
        default=None, ge=1, description="Trained trees: the deepest tree the centre releases."
    )
    model_max_leaves: int | None = Field(
        default=None, ge=2, description="Trained trees: the most leaves per tree."
    )
    model_max_estimators: int | None = Field(
        default=None, ge=1, description="Forests and boosting: the most trees."
    )
    model_max_features: int | None = Field(
        default=None, ge=1, description="Trained models: the most features a model may use."
    )

    synth_attack_excess_withhold: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Synthetic data: withhold when an attacker trained on the synthetic records "
        "beats the leave-one-out reference by this much accuracy (bootstrap lower bound > 0).",
    )
    synth_attack_excess_review: float = Field(
        default=0.02, ge=0.0, le=1.0, description="Synthetic data: review at this excess."
    )
    synth_certain_correct_withhold: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Synthetic data: withhold at this excess of near-certain correct inferences.",
    )
    synth_full_row_uniques_review: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="Synthetic data: review when the synthetic records reproduce this much more "
        "of the rows unique within a half of the real data than the other half does (split-half "
        "reference, bootstrap lower bound > 0).",
    )
    synth_full_row_uniques_withhold: float = Field(
        default=0.03, ge=0.0, le=1.0, description="Synthetic data: withhold at this excess."
    )
    synth_dcr_close_review: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="Synthetic data: review when p_syn - p_ref (records closer than the real "
        "5 % leave-one-out distance) reaches this and is significant.",
    )
    synth_dcr_close_withhold: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Synthetic data: withhold at this gap (also significant).",
    )
    synth_yp_y: Literal["loo_q05"] | float = Field(
        default="loo_q05",
        description="Synthetic data: the (y,p)-coverage distance y, or 'loo_q05' for the 5 % "
        "quantile of the real leave-one-out distances.",
    )
    synth_yp_p: float = Field(
        default=0.10, ge=0.0, le=1.0, description="Synthetic data: (y,p)-coverage share p."
    )
    synth_p_privacy_tau: float = Field(
        default=0.9, ge=0.0, le=1.0, description="Synthetic data: p-privacy association cut."
    )
    synth_max_keysets: int = Field(
        default=20, ge=1, description="Synthetic data: attack key sets per key length."
    )
    synth_max_cells: int = Field(
        default=100_000, ge=1, description="Synthetic data: most cells of one marginal."
    )
    synth_max_model_cells: int = Field(
        default=10_000_000, ge=1, description="Synthetic data: most cells of the whole model."
    )
    synth_max_rows: int = Field(
        default=1_000_000, ge=1, description="Synthetic data: most synthetic rows."
    )
    synth_hungarian_max: int = Field(
        default=5000, ge=1, description="Synthetic data: records per (y,p)-coverage sample."
    )
    synth_action_on_check_error: Literal["review", "withhold"] = Field(
        default="review",
        description="Synthetic data: what a check that cannot run does (never release).",
    )

    @field_validator("spread_k", mode="before")
    @classmethod
    def _spread_number(cls, value: object) -> object:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator(
        "model_mia_auc_limit",
        "model_fairness_limit",
        "synth_attack_excess_withhold",
        "synth_attack_excess_review",
        "synth_certain_correct_withhold",
        "synth_full_row_uniques_review",
        "synth_full_row_uniques_withhold",
        "synth_dcr_close_review",
        "synth_dcr_close_withhold",
        "synth_yp_y",
        "synth_yp_p",
        "synth_p_privacy_tau",
        mode="before",
    )
    @classmethod
    def _model_number(cls, value: object) -> object:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("leverage_limit", mode="before")
    @classmethod
    def _limit_number(cls, value: object) -> object:
        # `leverage_limit: 1` in YAML is an int; strict mode would refuse it as a float
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _synth_consistent(self) -> RuleSet:
        from safeaccess.rules.synthetic.errors import SyntheticCheckError

        try:
            self.synth_rules  # noqa: B018 - SynthRules checks review <= withhold
        except SyntheticCheckError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def synth_rules(self) -> SynthRules:
        """The `synth_*` settings as the synthetic-data check's `SynthRules`."""
        from safeaccess.rules.synthetic.decision import SynthRules

        return SynthRules.from_mapping(
            {k: v for k, v in self.model_dump().items() if k.startswith("synth_")}
        )

    @property
    def leverage_limit_value(self) -> float:
        """The leverage limit in force: `leverage_limit`, or 1/threshold when it is not set."""
        return self.leverage_limit if self.leverage_limit is not None else 1.0 / self.threshold

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: object) -> object:
        # `version: 2` in YAML is an int; a version is a label, so accept it as text
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    def content_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON of every parameter, name and version included."""
        canonical = json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def label(self) -> str:
        """`name@version`, as recorded in decisions."""
        return f"{self.name}@{self.version}"

    def with_overrides(self, overrides: Mapping[str, Any]) -> RuleSet:
        """A new rule set with `overrides` applied on top of this one; invalid keys raise.

        Unless the overrides name the result, it is called `<base name>+overrides` so a decision
        never carries the base's label with different parameters.
        """
        unknown = sorted(set(overrides) - set(RuleSet.model_fields))
        if unknown:
            raise RuleSetError(
                f"unknown setting; allowed settings are {', '.join(RuleSet.model_fields)}",
                key=unknown[0],
            )
        merged = self.model_dump()
        merged.update(overrides)
        if "name" not in overrides:
            merged["name"] = f"{self.name}+overrides"
        try:
            return RuleSet.model_validate(merged)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = str(err["loc"][0]) if err["loc"] else None
            raise RuleSetError(_message(err), key=key) from None


def _message(err: Any) -> str:
    """A validation error's message, naming the sub-setting of a nested one (`days: ...`)."""
    inner = ".".join(str(p) for p in err["loc"][1:])
    return f"{inner}: {err['msg']}" if inner else str(err["msg"])


def _key_lines(node: yaml.Node) -> dict[str, int]:
    """Map each top-level key of a YAML mapping node to its 1-based line; reject duplicates."""
    if not isinstance(node, yaml.MappingNode):
        raise RuleSetError(
            "the file must be a mapping of settings (key: value per line)",
            line=node.start_mark.line + 1,
        )
    lines: dict[str, int] = {}
    for key_node, _value in node.value:
        key = str(key_node.value)
        line = key_node.start_mark.line + 1
        if key in lines:
            raise RuleSetError(
                f"duplicate setting (first given on line {lines[key]})", key=key, line=line
            )
        lines[key] = line
    return lines


def _parse(text: str) -> tuple[dict[str, Any], dict[str, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            raise RuleSetError("the file is empty")
        lines = _key_lines(node)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise RuleSetError(
            f"not valid YAML: {exc.problem or exc}", line=mark.line + 1 if mark else None
        ) from None
    except yaml.YAMLError as exc:
        raise RuleSetError(f"not valid YAML: {exc}") from None
    return data, lines


def _read(path_or_text: str | Path) -> str:
    if isinstance(path_or_text, Path):
        return path_or_text.read_text(encoding="utf-8")
    text = path_or_text
    if "\n" not in text and text.strip().endswith((".yaml", ".yml")):
        return Path(text.strip()).read_text(encoding="utf-8")
    return text


def load_ruleset(path_or_text: str | Path, *, base: RuleSet | None = None) -> RuleSet:
    """Load a rule set from a YAML file (a `Path`, or a `*.yaml`/`*.yml` path string) or text.

    Without `base` the file is a complete rule set (missing settings take the library defaults,
    which are those of `default.yaml`). With `base` it is an override file: only the keys it gives
    change. Raises `RuleSetError` with the offending key and line on any invalid content.
    """
    data, lines = _parse(_read(path_or_text))
    unknown = [k for k in data if k not in RuleSet.model_fields]
    if unknown:
        raise RuleSetError(
            f"unknown setting; allowed settings are {', '.join(RuleSet.model_fields)}",
            key=str(unknown[0]),
            line=lines.get(str(unknown[0])),
        )
    try:
        if base is not None:
            return base.with_overrides(data)
        return RuleSet.model_validate(data)
    except RuleSetError as exc:
        raise RuleSetError(
            str(exc).split(": ", 1)[-1],
            key=exc.key,
            line=lines.get(exc.key) if exc.key else None,
        ) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else None
        raise RuleSetError(_message(err), key=key, line=lines.get(key) if key else None) from None


def _load_default() -> RuleSet:
    text = resources.files("safeaccess.rules").joinpath("rulesets/default.yaml").read_text("utf-8")
    return load_ruleset(text)


DEFAULT_RULESET: RuleSet = _load_default()
"""The DwB/SDAP rule set shipped with the package (`rulesets/default.yaml`)."""
