"""Benchmark canonical JSON: `canonical.dumps` (the fast path) beside `rfc8785.dumps` and plain
`json.dumps`, per object, on objects like the ones the server signs and logs.

- record: an audit `checks` record of about 1 KB (str, ints, bools, nested dicts and lists);
- receipt: a receipt's signed fields (short strings and ints);
- floats: the same record with float facts, which takes the reference path (the cost of the
  check before falling back).

    python benchmarks/canonical.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import rfc8785

from safeaccess.client.protocol import canonical


def _record(floats: bool) -> dict[str, Any]:
    counts = [[312, 298], [401, 377], [250, 263], [199, 207], [330, 341]]
    facts: dict[str, Any] = {"cells": {"counts": counts}, "n_total": 2978}
    if floats:
        facts["dominance"] = [[0.31, 0.22], [0.18, 0.4], [0.27, 0.19], [0.5, 0.12], [0.2, 0.33]]
    return {
        "log": "safeaccess-audit",
        "version": 1,
        "index": 123456,
        "time": "2026-11-27T10:55:08.123456Z",
        "kind": "checks",
        "actor": "server",
        "sequence": "9f1c" * 8,
        "step": 3,
        "data": {
            "kind": "frequency_table",
            "verdict": "release",
            "findings": [
                {"check": "threshold", "verdict": "release", "item": f"cell {i}", "message": ""}
                for i in range(3)
            ],
            "ruleset_sha256": "ab" * 32,
            "facts": facts,
            "output_commitment": "cd" * 32,
            "commitment_scheme": "sha256(salt||jcs(output))",
            "backend": "process",
            "row_vars": ["region"],
            "col_vars": ["sex"],
            "margins": False,
            "note": None,
        },
    }


def _receipt() -> dict[str, Any]:
    return {
        "server": "centre-1",
        "sequence": "9f1c" * 8,
        "step": 3,
        "state": "released",
        "log_index": 123456,
        "output_commitment": "cd" * 32,
        "time": "2026-11-27T10:55:08.123456Z",
    }


def _per_object(fn: Callable[[Any], Any], value: Any, repeat: int) -> float:
    """Best of five runs of `repeat` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn(value)
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (best of 5 runs)")

    def plain(v: Any) -> bytes:
        return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    for name, value in [
        ("record", _record(False)),
        ("receipt", _receipt()),
        ("floats", _record(True)),
    ]:
        size = len(rfc8785.dumps(value))
        assert canonical.dumps(value) == rfc8785.dumps(value)
        ref = _per_object(rfc8785.dumps, value, args.repeat)
        fast = _per_object(canonical.dumps, value, args.repeat)
        base = _per_object(plain, value, args.repeat)
        print(
            f"{name:8} {size:5} bytes: rfc8785 {ref:7.1f} us, canonical {fast:7.1f} us "
            f"({ref / fast:4.1f}x), json.dumps {base:6.1f} us"
        )


if __name__ == "__main__":
    main()
