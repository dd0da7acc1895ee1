"""Run the synth worker in its own process, under a time limit (the API process never imports
JAX or mbi)."""

from __future__ import annotations

import base64
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from pydantic import ValidationError

from safeaccess.server.synth.protocol import WorkerReply, WorkerRequest

DEFAULT_TIMEOUT = 600.0


class SynthWorkerFailed(RuntimeError):
    """The worker crashed, timed out or answered nonsense; nothing was released."""


@dataclass(frozen=True)
class WorkerResult:
    columns: tuple[str, ...]
    codes: NDArray[np.int64]
    total: float
    total_sd: float
    implied: list[NDArray[np.float64]]


def run_worker(request: WorkerRequest, *, timeout: float = DEFAULT_TIMEOUT) -> WorkerResult:
    """Fit and sample in `python -m safeaccess.server.synth.worker`; raise `SynthWorkerFailed`."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "safeaccess.server.synth.worker"],
            input=request.model_dump_json().encode(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SynthWorkerFailed(f"the synth worker exceeded {timeout:g} s") from exc
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise SynthWorkerFailed(f"the synth worker failed ({done.returncode}): {tail[0]}")
    try:
        reply = WorkerReply.model_validate_json(done.stdout)
        raw = np.frombuffer(base64.b64decode(reply.codes, validate=True), dtype="<i4")
        codes = raw.reshape(reply.rows, len(reply.columns)).astype(np.int64)
    except (ValidationError, ValueError) as exc:
        raise SynthWorkerFailed("the synth worker's reply is not valid") from exc
    sizes = dict(request.domain)
    for i, name in enumerate(reply.columns):
        if name not in sizes or (
            codes.size and (codes[:, i].min() < 0 or codes[:, i].max() >= sizes[name])
        ):
            raise SynthWorkerFailed("the synth worker returned codes outside the domain")
    return WorkerResult(
        tuple(reply.columns),
        codes,
        reply.total,
        reply.total_sd,
        [np.asarray(v, dtype=np.float64) for v in reply.implied],
    )
