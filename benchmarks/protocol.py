"""Benchmark the binding-sequence protocol: sealing and verifying sequences of 10 to 100 000 steps.

Prints steps per second for `seal` (words, trace chain, header, signature), `verify_whole`
(signature check plus every reveal, what a CA or auditor does) and the per-step reveal path alone
(what the server does per request). Target: verification above 100 000 steps/s on one core.

    python benchmarks/protocol.py [--sizes 10 1000 100000]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.protocol import SequenceVerifier, seal, verify_whole

BODY = b'{"kind":"summary","statistics":["count","mean","sd"],"variables":["income"],"where":"age >= %d"}'


def _best_rate(n: int, run: Callable[[], object], min_seconds: float = 0.5) -> float:
    """Steps per second of the fastest of several runs (at least one, about `min_seconds`)."""
    best = float("inf")
    spent = 0.0
    while spent < min_seconds or best == float("inf"):
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        spent += elapsed
    return n / best


def measure(n: int, key: Ed25519PrivateKey) -> tuple[float, float, float]:
    """(seal, verify_whole, per-step reveal) rates in steps per second for an n-step sequence."""
    public = key.public_key()
    bodies = [BODY % i for i in range(n)]
    sealed = seal(bodies, key, researcher="r", project="p", dataset="d", server="s")
    pairs = [sealed.reveal_for(j) for j in range(1, n + 1)]

    def do_seal() -> object:
        return seal(bodies, key, researcher="r", project="p", dataset="d", server="s")

    def do_reveals() -> None:
        reveal = SequenceVerifier.for_sealed(sealed, public).reveal
        for j, (trace, body) in enumerate(pairs, start=1):
            reveal(j, trace, body)

    seal_rate = _best_rate(n, do_seal)
    whole_rate = _best_rate(n, lambda: verify_whole(sealed, public))
    # The per-step cost: all reveals minus the one-off header and signature check.
    setup_seconds = 1 / _best_rate(1, lambda: SequenceVerifier.for_sealed(sealed, public))
    reveals_seconds = n / _best_rate(n, do_reveals)
    step_rate = n / max(reveals_seconds - setup_seconds, 1e-12)
    return seal_rate, whole_rate, step_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1_000, 100_000])
    args = parser.parse_args()
    key = Ed25519PrivateKey.generate()
    print(f"python {platform.python_version()} on {platform.machine()}, one core")
    print(f"{'steps':>8} {'seal steps/s':>14} {'verify_whole steps/s':>22} {'reveal steps/s':>16}")
    for n in args.sizes:
        seal_rate, whole_rate, step_rate = measure(n, key)
        print(f"{n:>8} {seal_rate:>14,.0f} {whole_rate:>22,.0f} {step_rate:>16,.0f}")


if __name__ == "__main__":
    main()
