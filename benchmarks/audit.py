"""Benchmark the audit log: append cost per step, proofs at a million entries, verifying an export.

- append: a step's two transactions (reveal; outcome) through the real `Store` methods, with the
  audit records they append (step_revealed, run_started; run_finished, checks, outcome), against
  the same state changes with the appends stubbed out: the cost the log adds to a step
  (target < 2 ms) and the append rate in entries/s.
- proofs: a log of `--proof-entries` entries (default 10^6; records bulk-loaded with the same
  node layout, since a million one-by-one transactions would only measure the disk): inclusion
  and consistency proof sizes and generation times, and verification times.
- verify: logs of `--verify-entries` entries (default 10^5; e.g. `100000 1000000`) made of real
  sequences (signed headers, hash chains, decisions), verified by `safeaccess audit verify`'s
  code from an export file and through a live server (`--verify-mode`), each in a fresh process:
  wall time, the verifier's CPU time and its peak RSS (target: 10^5 entries in <= 10 s, memory
  flat in the log's size). `--log-dir DIR` keeps the built logs (a million entries take about
  ten minutes to build) and reuses them on the next run.

Peer figures (Trillian/Tessera, Rekor): an RFC 9162 proof at 10^6 leaves has 20 hashes (640
bytes) in any implementation; Tessera reads it from at most ~3 tiles, we read it from at most ~20
entries' rows (each keeps the subtrees it completes) fetched by one indexed query.

    python benchmarks/audit.py [--steps 300] [--proof-entries 1000000]
        [--verify-entries 100000 [1000000]] [--verify-mode export|server|both] [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, insert, update

from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.audit.merkle import (
    leaf_hash,
    node_hash,
    verify_consistency,
    verify_inclusion,
)
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.protocol import seal
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.server import store as store_module
from safeaccess.server.audit.records import settle_records
from safeaccess.server.auditors import AuditService
from safeaccess.server.config import initialise
from safeaccess.server.outcome import StepOutcome
from safeaccess.server.service import Service
from safeaccess.server.states import StepState
from safeaccess.server.store import auditlog, sequences
from safeaccess.server.store.schema import AuditHeadRow, DatasetRow, EventRow, StepRow

REGIONS = ["North", "South", "East", "West", "Centre"]


class _NoSandbox:
    """The benchmark drives the store directly; no analysis runs."""

    name = "process"

    def close(self) -> None:
        pass


def _output() -> dict[str, Any]:
    counts = [[random.randint(200, 900), random.randint(200, 900)] for _ in REGIONS]
    return {
        "type": "table",
        "source": "frequency_table",
        "statistic": "count",
        "value": None,
        "row_vars": ["region"],
        "col_vars": ["sex"],
        "row_labels": [[r] for r in REGIONS],
        "col_labels": [["F"], ["M"]],
        "values": [[float(c) for c in row] for row in counts],
        "margins": False,
        "facts": {"cells": {"counts": counts}, "n_total": sum(map(sum, counts))},
    }


class Centre:
    """A data directory with one researcher and one dataset row, driven through `Store`."""

    def __init__(self, root: Path):
        initialise(root, server_id="bench-centre")
        self.service = Service(root, backend=_NoSandbox())  # type: ignore[arg-type]
        self.store = self.service.store
        self.key = Ed25519PrivateKey.generate()
        self.store.add_project("p")
        pub = self.key.public_key()
        self.store.add_researcher("ada", public_key_text(pub), fingerprint(pub), ["p"])
        with self.store.transaction() as s:
            row = DatasetRow(
                name="census",
                version=1,
                project="p",
                path="x",
                sha256="0" * 64,
                rows=1,
                dataset_metadata={},
                rules_path=None,
            )
            s.add(row)
            s.flush()
            self.dataset_id = row.id
        self.body = to_body(FrequencyTable(rows=["region"], cols=["sex"]))
        self.ruleset_hash = DEFAULT_RULESET.content_hash()

    @classmethod
    def reopen(cls, root: Path) -> Centre:
        """A centre built earlier (the benchmark's `--log-dir`): its service only."""
        centre = cls.__new__(cls)
        centre.service = Service(root, backend=_NoSandbox())  # type: ignore[arg-type]
        centre.store = centre.service.store
        return centre

    def sequence(self, steps: int) -> None:
        """One sequence of `steps` released steps, each reveal and outcome one transaction."""
        sealed = seal(
            [self.body] * steps,
            self.key,
            researcher="ada",
            project="p",
            dataset="census",
            server="bench-centre",
        )
        seq_id = uuid.uuid4().hex
        for j in range(1, steps + 1):
            trace, body = sealed.reveal_for(j)
            step = StepRow(
                index=j,
                trace_hash=auditlog_sha(trace),
                body=body,
                body_hash=auditlog_sha(body),
                last=j == steps,
            )
            reveal = self.service.flow.reveal_data(trace, step)
            if j == 1:
                sequences.create_sequence(
                    self.store,
                    sequence_id=seq_id,
                    researcher="ada",
                    project="p",
                    dataset_id=self.dataset_id,
                    header=sealed.header,
                    header_hash=auditlog_sha(sealed.header),
                    nonce=uuid.uuid4().hex,
                    signature=sealed.signature,
                    endorsements=[],
                    verifier_state={},
                    first_step=step,
                    event_data={
                        "header": _b64(sealed.header),
                        "signature": _b64(sealed.signature),
                        "endorsements": [],
                        "reveal": reveal,
                    },
                )
            else:
                seq = self.store.get_sequence(seq_id)
                assert seq is not None
                sequences.begin_step(
                    self.store,
                    seq_id,
                    expected_version=seq.version,
                    step=step,
                    verifier_state={},
                    event_data=reveal,
                )
            output = _output()
            outcome = StepOutcome(
                state=StepState.RELEASED,
                kind="frequency_table",
                output=output,
                public_output={k: v for k, v in output.items() if k != "facts"},
                decision={
                    "verdict": "release",
                    "findings": [],
                    "ruleset": DEFAULT_RULESET.label,
                    "ruleset_hash": self.ruleset_hash,
                },
                ruleset_hash=self.ruleset_hash,
                backend="process",
                wall_seconds=0.05,
            )
            sequences.settle_step(
                self.store,
                seq_id,
                j,
                outcome,
                event_data=self.service.flow.settle_data(outcome, DEFAULT_RULESET),
            )

    def fast_sequences(self, count: int, steps: int) -> int:
        """`count` sequences of `steps` released steps, their records built by the same helpers
        the store uses, appended in one transaction (the verifier's work does not depend on
        how many transactions wrote the log). Returns the log's size."""
        entries: list[auditlog.Entry] = []
        for _ in range(count):
            sealed = seal(
                [self.body] * steps,
                self.key,
                researcher="ada",
                project="p",
                dataset="census",
                server="bench-centre",
            )
            seq_id = uuid.uuid4().hex
            entries.append(
                auditlog.Entry(
                    "sequence_opened",
                    "ada",
                    {
                        "header": _b64(sealed.header),
                        "signature": _b64(sealed.signature),
                        "endorsements": [],
                    },
                    seq_id,
                )
            )
            for j in range(1, steps + 1):
                trace, body = sealed.reveal_for(j)
                step = StepRow(
                    index=j,
                    trace_hash=auditlog_sha(trace),
                    body=body,
                    body_hash=auditlog_sha(body),
                    last=j == steps,
                )
                entries += store_module.sequences.reveal_entries(
                    "ada", self.service.flow.reveal_data(trace, step), seq_id, j
                )
                output = _output()
                outcome = StepOutcome(
                    state=StepState.RELEASED,
                    kind="frequency_table",
                    output=output,
                    public_output={k: v for k, v in output.items() if k != "facts"},
                    decision={
                        "verdict": "release",
                        "findings": [],
                        "ruleset": DEFAULT_RULESET.label,
                        "ruleset_hash": self.ruleset_hash,
                    },
                    ruleset_hash=self.ruleset_hash,
                    backend="process",
                    wall_seconds=0.05,
                )
                records = settle_records(
                    step, outcome, self.service.flow.settle_data(outcome, DEFAULT_RULESET)
                )
                entries += [
                    auditlog.Entry("run_finished", "server", records.run, seq_id, j),
                    auditlog.Entry("checks", "server", records.checks, seq_id, j),
                    auditlog.Entry("step_released", "server", records.outcome, seq_id, j),
                ]
        with self.store.transaction() as s:
            auditlog.append_many(s, entries)
            return auditlog.size(s)


def auditlog_sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")


def bench_append(steps: int) -> None:
    """Steps through the real Store methods; the time spent appending is measured inside
    `append_many` (wall and CPU), so the machine's load does not hide the log's own cost."""
    spent = {"wall": 0.0, "cpu": 0.0, "entries": 0}
    real = store_module.auditlog.append_many

    def timed(session: Any, items: list[Any]) -> list[int]:
        wall, cpu = time.perf_counter(), time.process_time()
        result = real(session, items)
        spent["wall"] += time.perf_counter() - wall
        spent["cpu"] += time.process_time() - cpu
        spent["entries"] += len(items)
        return result

    with tempfile.TemporaryDirectory() as tmp:
        centre = Centre(Path(tmp) / "data")
        try:
            centre.sequence(2)  # warm-up (and the rule set's first record)
            n = 10 * max(1, steps // 10)
            with mock.patch.object(store_module.auditlog, "append_many", side_effect=timed):
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(n // 10):
                    centre.sequence(10)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            centre.service.close()
    per_step = spent["entries"] / n
    print(f"append ({n} steps through Store: reveal and outcome transactions, SQLite):")
    print(
        f"  whole step transactions:   {wall / n * 1000:7.2f} ms wall, {cpu / n * 1000:6.2f} ms CPU"
    )
    print(
        f"  of which appending:        {spent['wall'] / n * 1000:7.2f} ms wall, "
        f"{spent['cpu'] / n * 1000:6.2f} ms CPU per step  (target < 2 ms)"
    )
    print(
        f"  {per_step:.0f} entries per step; append rate {spent['entries'] / spent['wall']:,.0f} "
        f"entries/s (wall), {spent['entries'] / spent['cpu']:,.0f} entries/s (CPU)"
    )


def _bulk_fill(store: Any, total: int) -> None:
    """Load `total` small records with the node layout `auditlog.append` writes."""
    batch = 50_000
    level_stacks: list[bytes] = []
    with store.transaction() as s:
        s.execute(delete(AuditHeadRow))
        s.execute(insert(AuditHeadRow), [{"id": 1, "size": 0}])
    for start in range(0, total, batch):
        events = []
        for index in range(start, min(total, start + batch)):
            # Plain sorted compact JSON is RFC 8785 for these integer-and-string records.
            record = json.dumps(
                {
                    "log": "safeaccess-audit",
                    "version": 1,
                    "index": index,
                    "time": "2026-01-01T00:00:00.000000Z",
                    "kind": "bench",
                    "actor": "bench",
                    "sequence": None,
                    "step": None,
                    "data": {"i": index},
                },
                sort_keys=True,
                separators=(",", ":"),
            ).encode()
            # The entry keeps its leaf and every subtree it completes (`EventRow.merkle`).
            current = leaf_hash(record)
            kept = [current]
            idx = index
            while idx & 1:
                left = level_stacks.pop()
                current = node_hash(left, current)
                idx >>= 1
                kept.append(current)
            level_stacks.append(current)
            events.append(
                {
                    "log_index": index,
                    "kind": "bench",
                    "actor": "bench",
                    "record": record,
                    "merkle": b"".join(kept),
                }
            )
        with store.transaction() as s:
            s.execute(insert(EventRow), events)
            s.execute(update(AuditHeadRow).values(size=min(total, start + batch)))


def _timed(fn: Any, repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bench_proofs(total: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = store_module.Store(f"sqlite:///{Path(tmp) / 'log.db'}")
        try:
            start = time.perf_counter()
            _bulk_fill(store, total)
            print(f"proofs at {total:,} entries (bulk load {time.perf_counter() - start:.0f} s):")
            with store.transaction() as s:
                t_root, root = _timed(lambda: auditlog.root(s, total), 20)
                print(f"  root of the whole tree:     {t_root * 1000:7.2f} ms")
                rng = random.Random(1)
                inc_times, inc_sizes, ver_times = [], [], []
                for _ in range(200):
                    index = rng.randrange(total)
                    t, proof = _timed(lambda i=index: auditlog.inclusion_proof(s, i, total), 1)
                    leaf = auditlog.leaf_hashes(s, index, index + 1)[index]
                    v0 = time.perf_counter()
                    verify_inclusion(index, total, leaf, proof, root)
                    ver_times.append(time.perf_counter() - v0)
                    inc_times.append(t)
                    inc_sizes.append(len(proof))
                print(
                    f"  inclusion proof: {max(inc_sizes)} hashes ({32 * max(inc_sizes)} bytes), "
                    f"generated in {statistics.median(inc_times) * 1000:.2f} ms median, "
                    f"{max(inc_times) * 1000:.2f} ms max; verified in "
                    f"{statistics.median(ver_times) * 1e6:.0f} us"
                )
                con_times, con_sizes = [], []
                for _ in range(100):
                    size1 = rng.randrange(1, total)
                    t, proof = _timed(lambda a=size1: auditlog.consistency_proof(s, a, total), 1)
                    root1 = auditlog.root(s, size1)
                    verify_consistency(size1, total, root1, root, proof)
                    con_times.append(t)
                    con_sizes.append(len(proof))
                print(
                    f"  consistency proof: up to {max(con_sizes)} hashes "
                    f"({32 * max(con_sizes)} bytes), generated in "
                    f"{statistics.median(con_times) * 1000:.2f} ms median, "
                    f"{max(con_times) * 1000:.2f} ms max"
                )
        finally:
            store.close()


def _build_log(root: Path, entries: int) -> tuple[Centre, float]:
    """A centre whose log holds at least `entries` entries of real sequences (reused when
    `root` already holds one of that size: building a million entries takes minutes)."""
    start = time.perf_counter()
    if (root / "safeaccess.db").exists():
        centre = Centre.reopen(root)
        with centre.store.transaction() as s:
            if auditlog.size(s) >= entries:
                return centre, 0.0
        centre.service.close()
        raise SystemExit(f"{root} holds a smaller log; remove it or pick another --log-dir")
    centre = Centre(root)
    centre.sequence(2)
    size = 0
    while size < entries:
        size = centre.fast_sequences(20, 10)
    return centre, time.perf_counter() - start


# The verifier runs in a fresh interpreter that imports only the client's audit code, so its
# peak RSS is the verifier's (plus an interpreter), not the benchmark's server and data stack.
_CHILD = """
import json, sys, time
from pathlib import Path
from safeaccess.client.audit.remote import ServerSource, SignedClient
from safeaccess.client.audit.verify import ExportSource, verify_log

def hwm():  # peak RSS of this process image, MiB (ru_maxrss would count the forking parent)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

base = hwm()
start, cpu = time.perf_counter(), time.process_time()
if sys.argv[1] == "export":
    report = verify_log(ExportSource(Path(sys.argv[2])))
else:
    client = SignedClient(sys.argv[2], Path(sys.argv[3]), sys.argv[4])
    report = verify_log(ServerSource(client))
    client.close()
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"size": report.size, "sequences": report.sequences,
                  "decisions": report.decisions, "wall": wall, "cpu": cpu,
                  "peak_mib": hwm(), "import_mib": base}))
"""


def _run_child(*argv: str) -> dict[str, Any]:
    """Verify in a child process: `export PATH` or `server URL KEY AUDITOR`."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *argv], check=True, capture_output=True, text=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_verify(entries: int, modes: list[str], log_dir: str | None = None) -> None:
    """Verify a log of `entries` entries from an export file and/or through a live server,
    each in its own process (time, CPU, peak RSS)."""
    from cryptography.hazmat.primitives import serialization

    from safeaccess.server.http.app import create_app
    from safeaccess.server.http.embedded import EmbeddedServer

    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(log_dir) / str(entries) if log_dir is not None else Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        centre, build = _build_log(tmp / "data", entries)
        try:
            export = tmp / "log.export"
            if not export.exists():
                with open(export, "wb") as handle:
                    for chunk in AuditService.of(centre.service).export():
                        handle.write(chunk)
            auditor = Ed25519PrivateKey.generate()
            name = f"eve{uuid.uuid4().hex[:8]}"
            centre.store.add_auditor(
                name, public_key_text(auditor.public_key()), fingerprint(auditor.public_key())
            )
            key = tmp / "eve.key"
            key.write_bytes(
                auditor.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            results: dict[str, dict[str, Any]] = {}
            if "export" in modes:
                results["export"] = _run_child("export", str(export))
            if "server" in modes:
                with EmbeddedServer(create_app(centre.service)) as srv:
                    results["server"] = _run_child("server", srv.url, str(key), name)
        finally:
            centre.service.close()
    for mode, r in results.items():
        print(
            f"verify {r['size']:,} entries from {'an export' if mode == 'export' else 'the server'}"
            f" ({r['sequences']:,} sequences, {r['decisions']:,} decisions; log built in "
            f"{build:.0f} s):"
        )
        print(
            f"  {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU of the verifier (target <= 10 s at "
            f"100,000); {r['size'] / r['wall']:,.0f} entries/s; peak RSS {r['peak_mib']:.0f} MiB "
            f"({r['import_mib']:.0f} MiB after imports)"
        )


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--proof-entries", type=int, default=1_000_000)
    parser.add_argument(
        "--verify-entries",
        "--export-entries",
        type=int,
        nargs="+",
        default=[100_000],
        help="log sizes to verify (e.g. 100000 1000000)",
    )
    parser.add_argument(
        "--verify-mode",
        choices=["export", "server", "both"],
        default="both",
        help="verify an export file, through a live server, or both",
    )
    parser.add_argument(
        "--log-dir", help="keep the built logs here and reuse them on the next run (verify)"
    )
    parser.add_argument("--only", choices=["append", "proofs", "verify"], default=None)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, {_load()} (wall times grow with load; CPU times less so)")
    if args.only in (None, "append"):
        bench_append(args.steps)
    if args.only in (None, "proofs"):
        bench_proofs(args.proof_entries)
    if args.only in (None, "verify"):
        modes = ["export", "server"] if args.verify_mode == "both" else [args.verify_mode]
        for entries in args.verify_entries:
            bench_verify(entries, modes, args.log_dir)


if __name__ == "__main__":
    main()
