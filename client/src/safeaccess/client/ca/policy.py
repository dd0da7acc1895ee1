"""Certification policies: versioned YAML data, parsed strictly into pydantic models.

A policy says what a certification authority requires of a whole sequence before it
countersigns it. The two shipped ones (`explainable`, `fair`) live beside this module in
`policies/`; a CA may write its own in the same format (docs/ca.md). Unknown keys are errors,
so a misspelt limit can never silently certify more than its author meant.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Annotated, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from safeaccess.client.analyses import ModelFamily
from safeaccess.client.protocol import canonical

POLICY_FORMAT: Final = "safeaccess-ca-policy/1"
SHIPPED_POLICIES: Final = ("explainable", "fair")
MAX_POLICY_BYTES: Final = 64 * 1024

KindName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)]


class PolicyError(ValueError):
    """A policy that cannot be loaded: not found, not YAML, or not in the policy format."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SequenceRules(_Strict):
    """Requirements on the sequence as a whole."""

    forbidden_kinds: tuple[KindName, ...] = Field(
        default=(), description="Analysis kinds the sequence may not contain at all."
    )
    require_fairness_evaluation: bool = Field(
        default=False,
        description="At least one model_training step must have `fairness` set, so that its "
        "output carries the fairness report on the protected attribute.",
    )


class FairnessRules(_Strict):
    """Every model_training step must apply one of `treatments` on an accepted attribute."""

    treatments: tuple[
        Literal["reweighing", "exponentiated_gradient", "threshold_optimizer"], ...
    ] = Field(min_length=1, description="Acceptable fairness treatments ('none' never is).")
    protected: tuple[str, ...] | None = Field(
        default=None,
        min_length=1,
        description="Acceptable protected attributes; omitted: the CA names them when it "
        "certifies (`--protected`).",
    )


class ModelRules(_Strict):
    """Requirements on every model_training step."""

    families: tuple[ModelFamily, ...] | None = Field(
        default=None, min_length=1, description="Allowed families; omitted: any family."
    )
    max_depth: int | None = Field(
        default=None, ge=1, description="Trees must declare max_depth, at most this."
    )
    max_leaves: int | None = Field(
        default=None,
        ge=2,
        description="Trees must be bounded to at most this many leaves, by max_leaf_nodes or "
        "by a max_depth d with 2**d leaves at most.",
    )
    max_features: int | None = Field(default=None, ge=1, description="At most this many features.")
    fairness: FairnessRules | None = None


class Policy(_Strict):
    """A certification policy (one YAML document)."""

    format: Literal["safeaccess-ca-policy/1"]
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$", description="The claim it grants.")
    version: int = Field(ge=1)
    description: str = ""
    sequence: SequenceRules = Field(default_factory=SequenceRules)
    models: ModelRules = Field(default_factory=ModelRules)

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        if self.sequence.require_fairness_evaluation and "model_training" in (
            self.sequence.forbidden_kinds
        ):
            raise ValueError(
                "sequence.require_fairness_evaluation needs a model_training step, which "
                "sequence.forbidden_kinds forbids"
            )
        return self

    def sha256(self) -> str:
        """SHA-256 of the policy's canonical JSON: which exact rules a claim was granted under."""
        return hashlib.sha256(canonical.dumps(self.model_dump(mode="json"))).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'policy'}: {err['msg']}"
        for err in exc.errors()[:8]
    )


def parse_policy(text: str, *, source: str = "the policy") -> Policy:
    """Parse policy YAML text; raises `PolicyError` naming what to fix."""
    if len(text.encode("utf-8")) > MAX_POLICY_BYTES:
        raise PolicyError(f"{source} is larger than {MAX_POLICY_BYTES} bytes")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PolicyError(f"{source} must be a YAML mapping with format, name, version, ...")
    if data.get("format") != POLICY_FORMAT:
        raise PolicyError(f"{source}: format must be {POLICY_FORMAT!r}, got {data.get('format')!r}")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"{source} is not a valid policy: {_problems(exc)}") from None


def load_policy(spec: str | Path) -> Policy:
    """A shipped policy by name (`explainable`, `fair`) or a policy YAML file by path."""
    if isinstance(spec, str) and spec in SHIPPED_POLICIES:
        text = (
            resources.files("safeaccess.client.ca")
            .joinpath("policies", f"{spec}.yaml")
            .read_text(encoding="utf-8")
        )
        return parse_policy(text, source=f"shipped policy {spec!r}")
    path = Path(spec)
    if not path.is_file():
        raise PolicyError(
            f"no policy {str(spec)!r}: give a shipped policy ({', '.join(SHIPPED_POLICIES)}) "
            "or the path of a policy YAML file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from None
    return parse_policy(text, source=f"policy file {path}")
