"""Prometheus metrics of an API replica or a worker (prometheus-client, its default registry).

The API serves them at `/metrics` (`http/app.py`), a worker on `--metrics-port`
(`jobs/worker.py`). The counters and histograms are the process's own and are updated where
the work happens: a step's outcome and duration when it is recorded (`steps/flow.py`), its
sandbox run (`steps/pipeline.py`), the query-set admission, authentication failures. The
queue's state (jobs by state and queue, the workers' last heartbeats) is read from
procrastinate's tables at each scrape (`QueueCollector`), so every replica and worker reports
the same cluster-wide figures: sum or max them in the dashboard, never both.

Labels take only a bounded set of values the centre defines (kinds, states, error codes,
backends, dataset names): never a researcher's name, a sequence id or anything from an output.
What the metrics show is still the centre's activity, so the shipped HAProxy configuration
refuses `/metrics` from outside; Prometheus scrapes each replica on the private network.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from safeaccess.server.store.database import Database

log = logging.getLogger("safeaccess.server.metrics")

T = TypeVar("T")

#: Step durations: a table step takes tens of ms, an OLS hundreds, a script up to its limit.
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: The query-set admission: a gate over the scope's state, plus the wait for its lock.
ADMISSION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)

STEPS = Counter(
    "safeaccess_steps",
    "Steps recorded by this process, by analysis kind and outcome (the step's state).",
    ["kind", "outcome"],
)
STEP_SECONDS = Histogram(
    "safeaccess_step_seconds",
    "Time from the start of a step's computation to its record, by analysis kind.",
    ["kind"],
    buckets=STEP_BUCKETS,
)
ADMISSION_SECONDS = Histogram(
    "safeaccess_admission_seconds",
    "The query-set admission of a checked output: the scope lock's wait and the gate.",
    buckets=ADMISSION_BUCKETS,
)
SANDBOX_RUNS = Counter(
    "safeaccess_sandbox_runs",
    "Sandbox runs started by this process, by backend.",
    ["backend"],
)
SANDBOX_FAILURES = Counter(
    "safeaccess_sandbox_failures",
    "Sandbox runs that did not return an output, by backend and reason (analysis_failed, "
    "limit_exceeded, job_crashed, sandbox_unavailable...).",
    ["backend", "reason"],
)
DP_CHARGE = Counter(
    "safeaccess_dp_charge",
    "Differential-privacy budget charged by the releases this process recorded, by dataset: "
    "the ledgers' additive charge (Delta/sigma)^2 (their epsilon is not additive; each "
    "ledger's epsilon is `dataset budget`).",
    ["dataset"],
)
AUTH_FAILURES = Counter(
    "safeaccess_auth_failures",
    "Refused authentications by the API, by who tried (researcher, auditor) and answer "
    "(unauthenticated, too_many_failures).",
    ["kind", "reason"],
)
JOBS_HANDED_BACK = Counter(
    "safeaccess_jobs_handed_back",
    "Jobs a stopping worker handed back to the queue, their sandboxes stopped before they "
    "finished (`jobs/handback.py`), by task (step, script).",
    ["task"],
)
SANDBOX_MODE = Gauge(
    "safeaccess_sandbox_mode",
    "1 for the sandbox backend and mode this process runs (process/forkserver, process/warm, "
    "docker...).",
    ["backend", "mode"],
)


def timed(histogram: Histogram, call: Callable[..., T]) -> Callable[..., T]:
    """`call`, its duration observed in `histogram` (whether it returns or raises)."""

    def wrapper(*args: object, **kwargs: object) -> T:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            histogram.observe(time.perf_counter() - started)

    return wrapper


def step_recorded(
    kind: str | None, outcome: str, seconds: float, dp_charge: float | None, dataset: str
) -> None:
    """Count a recorded step: its outcome, its duration and the DP budget it charged."""
    label = kind or "unknown"
    STEPS.labels(kind=label, outcome=outcome).inc()
    STEP_SECONDS.labels(kind=label).observe(seconds)
    if dp_charge:
        DP_CHARGE.labels(dataset=dataset).inc(dp_charge)


class QueueCollector(Collector):
    """The job queue's state, read from procrastinate's tables at each scrape (PostgreSQL
    only): jobs by queue and state, and each worker's last heartbeat."""

    def __init__(self, store: Database):
        self.store = store

    def describe(self) -> Iterable[Metric]:
        return []  # nothing is collected at registration (the database may be down then)

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "safeaccess_jobs",
            "Jobs in procrastinate's queue, by queue and state (todo is the queue's depth).",
            labels=["queue", "state"],
        )
        seen = GaugeMetricFamily(
            "safeaccess_worker_heartbeat_age_seconds",
            "Seconds since each live procrastinate worker's last heartbeat.",
            labels=["worker"],
        )
        from safeaccess.server.store.queue_admin import job_counts, worker_heartbeats

        try:
            for (queue, state), count in job_counts(self.store).items():
                jobs.add_metric([queue, state], count)
            for worker, age in worker_heartbeats(self.store):
                seen.add_metric([worker], age)
        except Exception as exc:  # a scrape during an outage reports what it can
            log.warning("queue metrics unavailable: %s", str(exc).strip().splitlines()[0])
            return
        yield jobs
        yield seen


def register_queue(store: Database, registry: CollectorRegistry = REGISTRY) -> Callable[[], None]:
    """Report the queue's state from this store; returns the function that stops it."""
    collector = QueueCollector(store)
    registry.register(collector)
    return lambda: registry.unregister(collector)
