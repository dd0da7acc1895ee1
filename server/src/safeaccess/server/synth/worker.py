"""The synth worker: `python -m safeaccess.server.synth.worker`, one fit per process.

Reads one `WorkerRequest` (JSON) on stdin, fits Private-PGM to the noisy marginals and samples
records, and writes one `WorkerReply` (JSON) on stdout. It sees released quantities only (noisy
tables, their sigmas, the domain): never the data, never the true count. JAX and mbi are imported
here, not in the API process; the server runs this under a time limit (`worker_client.py`).
"""

from __future__ import annotations

import base64
import sys

import numpy as np

from safeaccess.server.synth.protocol import WorkerReply, WorkerRequest


def serve(request: WorkerRequest) -> WorkerReply:
    """Fit and sample as `request` asks."""
    from safeaccess.server.synth.fit import NoisyMarginal, fit_and_sample, model_marginal

    measurements = [
        NoisyMarginal(tuple(m.clique), np.asarray(m.values, dtype=np.float64), m.sigma)
        for m in request.measurements
    ]
    fit = fit_and_sample(
        dict(request.domain),
        measurements,
        rows=request.rows,
        iterations=request.iterations,
        seed=request.seed,
    )
    implied = [model_marginal(fit, m.clique).ravel().tolist() for m in request.measurements]
    codes = np.ascontiguousarray(fit.data, dtype="<i4")
    return WorkerReply(
        columns=list(fit.columns),
        rows=int(codes.shape[0]),
        codes=base64.b64encode(codes.tobytes()).decode("ascii"),
        total=fit.total,
        total_sd=fit.total_sd,
        implied=implied,
    )


def main() -> int:
    request = WorkerRequest.model_validate_json(sys.stdin.buffer.read())
    reply = serve(request)
    sys.stdout.write(reply.model_dump_json())
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
