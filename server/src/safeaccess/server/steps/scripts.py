"""Script steps: answered "in review" at once, run in the background, seen by checkers only.

A script controls its process. Run while the researcher waits, it could sleep for a time set by a
confidential value (read back from the reveal's latency), or crash or exhaust a limit on a
condition of the data (read back from `script_crashed` / `limit_exceeded`), all before any person
looked at it. So the reveal of a script step does no more than what the analysis alone decides
(parse and validate it), records the step as `review` and returns; the run happens afterwards in
a queue of its own (`max_concurrent_scripts` slots, fair across researchers). Its result (output,
or the failure, the limit hit, the crash, the run time) is stored on the step for the output
checkers, without changing anything the researcher can see: not the state, not the step's or
the sequence's update time. She learns the checker's decision and message, nothing else.

A script step in review with neither an output nor an error has not run yet; the server runs
such steps again when it starts, so a restart loses no run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.backend import Backend, Limits
from safeaccess.server.digests import json_hash
from safeaccess.server.errors import Unavailable
from safeaccess.server.outcome import StepOutcome
from safeaccess.server.states import StepState
from safeaccess.server.steps.pipeline import StepContext, run_step
from safeaccess.server.steps.revealed import SCRIPT_KIND as SCRIPT_KIND
from safeaccess.server.steps.revealed import Revealed
from safeaccess.server.steps.scheduler import FairScheduler
from safeaccess.server.store import catalogue, scripts, sequences
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import DatasetRow

log = logging.getLogger("safeaccess.server.scripts")

RETRY_SECONDS = 5.0


def queued_outcome(ruleset: RuleSet) -> StepOutcome:
    """What a script step is recorded as on reveal, before it runs: in review. The rule set's
    hash is fixed now, so the receipt does not depend on how the run went."""
    return StepOutcome(
        state=StepState.REVIEW, kind=SCRIPT_KIND, ruleset_hash=ruleset.content_hash()
    )


@dataclass(frozen=True)
class RunContext:
    """What a background run needs from the service."""

    store: Database
    backend: Backend
    limits: Limits
    data_root: Path
    ruleset_for: Callable[[DatasetRow], RuleSet]


class ScriptRuns:
    """The background queue of script runs."""

    def __init__(
        self,
        context: RunContext,
        scheduler: FairScheduler,
        enqueue: Callable[[str, int, str], None] | None = None,
    ):
        self.context = context
        self.scheduler = scheduler
        # execution = "queue": a run is a job for the worker hosts, not a thread here.
        self.enqueue = enqueue
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._active: set[tuple[str, int]] = set()

    def submit(self, sequence_id: str, index: int, researcher: str) -> None:
        """Queue the run of a script step (once; a step already queued is left alone)."""
        if self.enqueue is not None:
            self.enqueue(sequence_id, index, researcher)
            return
        key = (sequence_id, index)
        with self._lock:
            if key in self._active or self._stop.is_set():
                return
            self._active.add(key)
            thread = threading.Thread(
                target=self._run,
                args=(sequence_id, index, researcher),
                name=f"script-{sequence_id}-{index}",
                daemon=True,
            )
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def resume(self) -> int:
        """Queue every script step in review that has not run (after a restart); how many."""
        with self.context.store.transaction() as s:
            rows = scripts.unrun_script_steps(s, SCRIPT_KIND)
        for sequence_id, index, researcher in rows:
            self.submit(sequence_id, index, researcher)
        return len(rows)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting runs; wait a little for those running (unfinished ones resume on the
        next start)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no run is queued or running (for tests and the demo)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._active:
                    return True
            time.sleep(0.05)
        return False

    def _run(self, sequence_id: str, index: int, researcher: str) -> None:
        try:
            while not self._stop.is_set():
                try:
                    with self.scheduler.slot(researcher):
                        if self._stop.is_set():
                            return
                        self._run_once(sequence_id, index)
                    return
                except Unavailable as exc:
                    # The centre failed, not the script: try again later (or after a restart).
                    log.warning("script run %s/%d postponed: %s", sequence_id, index, exc)
                    self._stop.wait(RETRY_SECONDS)
        except Exception:
            log.exception("script run %s/%d could not be recorded", sequence_id, index)
        finally:
            with self._lock:
                self._active.discard((sequence_id, index))

    def run_now(self, sequence_id: str, index: int) -> None:
        """Run a script step in this process (a worker host's job); `Unavailable` when the
        centre, not the script, failed (the job is then tried again)."""
        self._run_once(sequence_id, index)

    def record_lost(self, sequence_id: str, index: int, seconds: float | None) -> None:
        """Record a script run whose worker died as crashed, for the checkers: a script
        controls its process, so it is never run again by itself (it could read data from
        whether, and when, its host dies)."""
        step = sequences.get_step(self.context.store, sequence_id, index)
        if step is None or step.state != StepState.REVIEW or step.output is not None:
            return
        if step.error_code:
            return
        outcome = StepOutcome(
            state=StepState.FAILED,
            kind=SCRIPT_KIND,
            error_code="script_crashed",
            error_message="the worker running the script stopped (its lease expired)",
            wall_seconds=seconds,
        )
        self._record(sequence_id, index, outcome)

    def _run_once(self, sequence_id: str, index: int) -> None:
        ctx = self.context
        seq = sequences.get_sequence(ctx.store, sequence_id)
        step = sequences.get_step(ctx.store, sequence_id, index)
        if seq is None or step is None:
            return
        if step.state != StepState.REVIEW or step.output is not None or step.error_code:
            return  # decided (rejected) before it ran, or already run
        dataset = catalogue.get_dataset(ctx.store, seq.dataset_id)
        ruleset = ctx.ruleset_for(dataset)
        started = time.monotonic()
        outcome = run_step(
            Revealed.stored(step.body, last=step.last),
            StepContext(
                job_id=f"{seq.id}-{index}",
                metadata=DatasetMetadata.model_validate(dataset.dataset_metadata),
                dataset_path=ctx.data_root / dataset.path,
                backend=ctx.backend,
                limits=ctx.limits,
                ruleset=ruleset,
                n_records=dataset.rows,
            ),
        )
        elapsed = time.monotonic() - started
        if self._stop.is_set():
            # The server is stopping and may have killed the sandbox under the run: whatever it
            # reported is not the script's doing. Left unrecorded, it runs again on the next start.
            return
        if outcome.wall_seconds is None:
            # A failed run reports no time of its own; checkers still see how long it took.
            outcome = replace(outcome, wall_seconds=round(elapsed, 3))
        self._record(sequence_id, index, outcome)
        log.info(
            "script %s step %d ran in %.1f s: %s%s",
            sequence_id,
            index,
            elapsed,
            outcome.state.value,
            f" ({outcome.error_code})" if outcome.error_code else "",
        )

    def _record(self, sequence_id: str, index: int, outcome: StepOutcome) -> None:
        decision = outcome.decision or {}
        scripts.record_script_run(
            self.context.store,
            sequence_id,
            index,
            outcome,
            event_data={
                "script_run": {
                    "result": outcome.state.value,
                    "error_code": outcome.error_code,
                    "wall_seconds": outcome.wall_seconds,
                    "backend": outcome.backend,
                },
                "output_sha256": outcome.output_hash,
                "public_output_sha256": (
                    json_hash(outcome.public_output) if outcome.public_output is not None else None
                ),
                "verdict": decision.get("verdict"),
                "decision_sha256": json_hash(decision) if decision else None,
            },
        )
