"""What the audit log records of a step: the event data of its reveal and its settlement (built
by the step flow) and what the store writes of them when a step settles or is reviewed.

The service passes `event_data` with the run's fields under "run", the check's under "checks",
the rule set under "ruleset_contents"; any other key (other features' decision facts: `qss`,
`leverage`, `withhold_budget`, `dp`, `review`, ...) is carried into the checks record unchanged,
so a feature adds facts to the log by adding a key, without touching this module.
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from safeaccess.client.audit.records import COMMITMENT_SCHEME, new_salt
from safeaccess.server.audit.commitments import commitment
from safeaccess.server.audit.facts import decision_facts
from safeaccess.server.audit.leverage import leverage_record
from safeaccess.server.store.schema import StepRow

if TYPE_CHECKING:
    from safeaccess.rules.ruleset import RuleSet
    from safeaccess.sandbox.backend import Limits
    from safeaccess.server.outcome import StepOutcome

try:
    RUNNER_VERSION = importlib.metadata.version("safeaccess-sandbox")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
    RUNNER_VERSION = "unknown"

_STRUCTURED = frozenset({"run", "checks", "ruleset_contents"})


def run_data(backend: str, limits: Limits) -> dict[str, Any]:
    """What a run starts with, for the audit log: the sandbox backend, its limits, the
    runner's version."""
    return {
        "backend": backend,
        "limits": limits.model_dump(mode="json"),
        "runner_version": RUNNER_VERSION,
    }


def reveal_data(trace: bytes, step: StepRow, run: dict[str, Any]) -> dict[str, Any]:
    """A reveal as logged: the trace itself (the auditor re-runs the chain from the logged
    header) and the body's digest (the analysis text stays with the centre); `run` is
    `run_data`."""
    return {
        "trace": trace.hex(),
        "trace_sha256": step.trace_hash,
        "body_sha256": step.body_hash,
        "last": step.last,
        "run": run,
    }


def settle_data(outcome: StepOutcome, ruleset: RuleSet, run: dict[str, Any]) -> dict[str, Any]:
    """The audit-log fields of a settled step (see `settle_records`); features add their
    decision facts as further keys. `run` is `run_data`."""
    decision = outcome.decision or {}
    return {
        "run": {
            **run,
            "backend": outcome.backend,
            "wall_seconds": outcome.wall_seconds,
            "error_code": outcome.error_code,
        },
        "checks": {
            "kind": outcome.kind,
            "ruleset": decision.get("ruleset"),
            "ruleset_sha256": outcome.ruleset_hash,
            "verdict": decision.get("verdict"),
            "findings": decision.get("findings", []),
        },
        "ruleset_contents": ruleset.model_dump(mode="json"),
        "leverage": leverage_record(outcome.output, ruleset),
    }


@dataclass(frozen=True)
class SettleRecords:
    ruleset: dict[str, Any] | None
    run: dict[str, Any]
    checks: dict[str, Any]
    outcome: dict[str, Any]


def outcome_data(step: StepRow, output: Any, released: bool) -> dict[str, Any]:
    """The outcome fields: state facts and the salted commitment to the researcher's output.

    The salt is drawn once per step and kept with it (the opening goes in her receipt); a step
    reviewed later is committed to with the same salt, so both records commit to one output."""
    data: dict[str, Any] = {
        "trace_sha256": step.trace_hash,
        "body_sha256": step.body_hash,
        "last": step.last,
        "released": released,
        "output_commitment": None,
    }
    # Every step not released is committed to (to null when it has no output), so whether a
    # withheld step had an output is not told by the presence of a commitment.
    if output is not None or not released:
        if step.output_salt is None:
            step.output_salt = new_salt()
        data["output_commitment"] = commitment(step.output_salt, output)
        data["commitment_scheme"] = COMMITMENT_SCHEME
    return data


def settle_records(
    step: StepRow, outcome: StepOutcome, event_data: dict[str, Any]
) -> SettleRecords:
    contents = event_data.get("ruleset_contents")
    ruleset = None
    if isinstance(contents, dict) and outcome.ruleset_hash:
        decision = outcome.decision or {}
        # The exact text the rules library hashes (RFC 8785 would write 2.0 as 2 and change
        # the hash), so the auditor can check the hash and load the parameters from it.
        ruleset = {
            "sha256": outcome.ruleset_hash,
            "label": decision.get("ruleset"),
            "contents": json.dumps(
                contents, sort_keys=True, separators=(",", ":"), allow_nan=False
            ),
        }
    checks: dict[str, Any] = {
        **event_data.get("checks", {}),
        "facts": decision_facts(outcome.output),
    }
    for key, value in event_data.items():
        if key not in _STRUCTURED:
            checks[key] = value
    released = outcome.state.value == "released"
    return SettleRecords(
        ruleset=ruleset,
        run=dict(event_data.get("run", {})),
        checks=checks,
        outcome={
            **outcome_data(step, outcome.public_output, released),
            "state": outcome.state.value,
            # The researcher fetches this entry for her own step (to check her receipt): a
            # withhold's runner code (no_rows, singular, ...) would tell her what the data decided,
            # so only a failure the analysis alone decides names its code here. The true cause of
            # a withhold is in the checks record, for output checkers and auditors.
            "error_code": outcome.error_code if outcome.state.value == "failed" else None,
        },
    )
