"""What the server and the synth worker exchange (JSON over the worker's stdin and stdout)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WorkerMeasurement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    clique: list[str] = Field(min_length=1)
    values: list[float]
    sigma: float = Field(gt=0.0)


class WorkerRequest(BaseModel):
    """Domain (column, codes) in column order, the noisy marginals, and the sampling request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    domain: list[tuple[str, int]] = Field(min_length=1)
    measurements: list[WorkerMeasurement] = Field(min_length=1)
    rows: int | None = Field(default=None, ge=1)
    iterations: int = Field(default=1000, ge=1)
    seed: int | None = None


class WorkerReply(BaseModel):
    """The sampled records as little-endian int32 codes (records x columns, base64), the
    noisy total the row count came from, and the model's implied marginal of each measurement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    columns: list[str]
    rows: int
    codes: str
    total: float
    total_sd: float
    implied: list[list[float]]
