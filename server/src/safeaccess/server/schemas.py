"""Request and response bodies of the HTTP API (pydantic v2). Byte fields travel as base64,
traces as lowercase hex, the same encodings as the sealed-sequence file."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

TRACE_BYTES = 64
MAX_BODY_CHARS = 700_000


def _b64(value: object) -> object:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError("must be standard base64") from None
    raise ValueError("must be a base64 string")


def _trace(value: object) -> object:
    if not isinstance(value, str) or len(value) != 2 * TRACE_BYTES:
        raise ValueError(f"a trace is {TRACE_BYTES} bytes as {2 * TRACE_BYTES} hex digits")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ValueError("a trace must be hexadecimal") from None


B64 = Annotated[bytes, BeforeValidator(_b64)]
Trace = Annotated[bytes, BeforeValidator(_trace)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EndorsementIn(_In):
    ca: str = Field(min_length=1, max_length=256)
    claims: dict[str, Any] = Field(default_factory=dict)
    signature: B64


class OpenRequest(_In):
    """Open a sequence: the signed header, its endorsements and the reveal of step 1."""

    header: B64
    signature: B64
    endorsements: list[EndorsementIn] = Field(default_factory=list, max_length=16)
    trace: Trace = Field(description="T_1, hex.")
    body: B64 = Field(description="Instruction body i_1 (canonical JSON), base64.")


class RevealRequest(_In):
    """Reveal step j of an open sequence: T_j and i_j."""

    trace: Trace
    body: B64


class ReviewRequest(_In):
    reviewer: str = Field(min_length=1, max_length=128)
    note: str = Field(default="", max_length=4000)


class Reason(BaseModel):
    """Why a step was withheld or sent to review, in words safe to show the researcher."""

    check: str
    verdict: Literal["release", "withhold", "review"]
    item: str | None = None
    message: str


class ErrorInfo(BaseModel):
    code: str
    message: str


class BudgetView(BaseModel):
    """The researcher's withhold budget on one dataset (see docs/researcher.md)."""

    dataset: str = Field(description="Dataset name (the budget covers every version).")
    count: int = Field(description="Withholds allowed within the window.")
    days: int = Field(description="Length of the rolling window in days.")
    used: int = Field(description="Withholds received within the window.")
    remaining: int = Field(description="Withholds left before new sequences need approval.")


class StepView(BaseModel):
    sequence_id: str
    index: int
    dataset: str | None = Field(default=None, description="Name of the dataset the step ran on.")
    dataset_version: int | None = Field(
        default=None, description="The dataset version the sequence was opened on (and runs on)."
    )
    state: Literal["pending", "running", "released", "withheld", "review", "failed"]
    last: bool
    kind: str | None
    analysis: dict[str, Any] | None = Field(description="The researcher's own analysis body.")
    output: dict[str, Any] | None = Field(
        default=None, description="The released output (public part only); present once released."
    )
    reasons: list[Reason] = Field(default_factory=list)
    error: ErrorInfo | None = None
    ruleset: str | None = None
    ruleset_hash: str | None = None
    sequence_state: str
    updated_at: datetime
    receipt: dict[str, Any] | None = Field(
        default=None,
        description="The centre's Ed25519-signed statement of this step's final outcome: "
        "{fields, signature}; absent while the step is running or in review.",
    )
    review_note: str | None = Field(
        default=None, description="The output checker's message, once a checker decided."
    )
    withhold_budget: BudgetView | None = Field(
        default=None, description="Your withhold budget on this dataset now (None: no budget)."
    )


class SequenceView(BaseModel):
    id: str
    header_sha256: str = Field(description="SHA-256 of the signed header (finds a sequence again).")
    researcher: str
    project: str
    dataset: str
    dataset_version: int
    state: Literal[
        "opened", "awaiting_approval", "running", "released", "review", "finished", "aborted"
    ]
    current_index: int
    created_at: datetime
    updated_at: datetime
    steps: list[StepView]
    withhold_budget: BudgetView | None = Field(
        default=None, description="Your withhold budget on this dataset now (None: no budget)."
    )


class SequenceList(BaseModel):
    sequences: list[SequenceView]


class DPBudgetView(BaseModel):
    """The differential-privacy budget of the researcher's scope on a dataset."""

    scope: Literal["researcher", "project", "dataset"] = Field(
        description="Whose releases share this budget."
    )
    epsilon: float = Field(description="The whole budget's epsilon (at delta).")
    delta: float
    epsilon_spent: float = Field(description="Epsilon spent so far, composed exactly.")
    epsilon_remaining: float = Field(
        description="The largest epsilon (at delta) one more request may still ask for."
    )
    releases: int = Field(description="DP answers charged to this budget.")


class DatasetView(BaseModel):
    name: str
    version: int
    project: str
    description: str
    rows: int
    columns: list[dict[str, Any]]
    ruleset: str
    neighbours: dict[str, Any] | None = Field(
        default=None, description="The DP neighbouring relation the metadata states."
    )
    storage: Literal["memory", "duckdb"] = Field(
        default="memory",
        description="'duckdb': the dataset is queried out of memory: DuckDB computes frequency "
        "tables, histograms and magnitude tables of sum or mean over the file, other kinds read "
        "only the columns they use, scripts are refused with 'storage_unsupported'.",
    )
    reply_deadline_seconds: float | None = Field(
        default=None,
        description="With reply padding on: how long each step on this version computes, as "
        "seen from outside (a step that runs longer takes the next doubling of it).",
    )
    dp: dict[str, Any] | None = Field(
        default=None,
        description="The DP configuration (epsilon, delta, scope, mandatory, max_tpr_at_5pct) "
        "when the dataset answers differentially private kinds.",
    )
    dp_budget: DPBudgetView | None = Field(
        default=None, description="Your DP budget on this dataset now (None: no DP)."
    )
    mock: dict[str, Any] | None = Field(
        default=None,
        description="The published DP mock of this version: its manifest (rows, mu, epsilon, "
        "delta, sha256, tree, workload, created) and the centre's signature over it.",
    )
    withhold_budget: BudgetView | None = Field(
        default=None, description="Your withhold budget on this dataset now (None: no budget)."
    )
    rules: dict[str, Any] | None = Field(
        default=None,
        description="The output-checking rule set in force: every threshold (threshold, dof, "
        "nk_n/nk_k, p_ratio, zeros_disclosive, ...) and its content hash (`sha256`).",
    )
    reserved_tables: list[str] = Field(
        default_factory=list,
        description="The standard frequency tables the query-set auditor counts as released in "
        "this dataset's shared scope before any output, whoever asks for them (columns joined "
        "by '*': one-way tables, then pairs; docs/qss.md, 'Standard tables reserved'): an output "
        "that is one of their cells less fewer than k records is refused. A two-way table with a "
        "cell below k is not reserved; a one-way one counts as suppress=True releases it. Empty: "
        "none (a researcher's own scope, atoms mode, or the centre turned it off).",
    )


class PlanCheckRequest(_In):
    """An unsealed plan's analyses, checked for what they alone doom (nothing runs)."""

    version: int | None = Field(default=None, ge=1, description="Dataset version; newest if None.")
    analyses: list[dict[str, Any]] = Field(max_length=1000)


class PlanProblem(BaseModel):
    index: int = Field(description="Position of the analysis in the plan (0-based).")
    kind: str
    message: str


class PlanCheckView(BaseModel):
    dataset: str
    version: int
    problems: list[PlanProblem] = Field(
        description="Analyses refused whatever the data (DP budget, DP policy, DP setting)."
    )
    dp_budget: DPBudgetView | None = Field(description="Your DP budget now (None: no DP).")
    dp_budget_after: DPBudgetView | None = Field(
        description="What would remain once every DP request of the plan that fits is answered."
    )


class RehearsalStep(BaseModel):
    """One analysis of a rehearsed plan: what refuses it whatever the data, and its verdict on
    the mock under the dataset's output rules."""

    index: int = Field(description="Position of the analysis in the plan (0-based).")
    kind: str
    refused: list[str] = Field(
        default_factory=list, description="Refused by the analysis alone, whatever the data."
    )
    mock_verdict: Literal["release", "withhold", "review", "failed", "not_rehearsed"]
    checks: list[Reason] = Field(
        default_factory=list, description="The checks that fired on the mock's output."
    )
    note: str | None = None


class RehearsalView(BaseModel):
    dataset: str
    version: int
    rows: int = Field(description="The dataset's published row count.")
    mock_rows: int
    ruleset: str
    notes: list[str] = Field(description="What the mock had to invent.")
    disclaimer: str
    steps: list[RehearsalStep]


class Catalogue(BaseModel):
    datasets: list[DatasetView]


class Health(BaseModel):
    status: Literal["ok"]
    server_id: str
    server_key: str = Field(description="SHA-256 fingerprint of the server's Ed25519 key.")
    server_public_key: str = Field(
        description="The server's Ed25519 public key (32 raw bytes, base64): verifies receipts."
    )
    sandbox: str
    sandbox_mode: str = Field(
        default="",
        description="How the sandbox runs: the process backend's 'forkserver' (fast) or 'warm' "
        "(slow fallback), else the backend's name.",
    )
    api_version: Literal["v1"] = "v1"
