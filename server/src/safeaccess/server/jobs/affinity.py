"""A worker's side of dataset affinity: it remembers which datasets it holds warm and claims
with them (`store/affinity.py` has the claim itself)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from procrastinate import jobs as procrastinate_jobs
from procrastinate.connector import BaseConnector
from procrastinate.manager import JobManager

from safeaccess.server.store.affinity import FETCH_SQL

#: How many datasets a worker counts as warm: the process backend keeps the templates of its
#: `max_warm` (4) most recently used datasets, and the Docker pool refills those it last used.
WARM_DATASETS = 4


class WarmDatasets:
    """The datasets of the last jobs this worker claimed, most recent last (at most `size`)."""

    def __init__(self, size: int = WARM_DATASETS) -> None:
        self.size = max(1, size)
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, dataset: str) -> None:
        """A job on `dataset` was claimed: its templates are (or are about to be) warm here."""
        if not dataset:
            return
        with self._lock:
            self._recent[dataset] = None
            self._recent.move_to_end(dataset)
            while len(self._recent) > self.size:
                self._recent.popitem(last=False)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._recent)


class AffinityJobManager(JobManager):
    """procrastinate's job manager, claiming with `safeaccess_fetch_job_v1` (the same claim plus
    the warm datasets) instead of procrastinate's own function."""

    def __init__(
        self, connector: BaseConnector, warm: WarmDatasets, affinity_seconds: float
    ) -> None:
        super().__init__(connector)
        self.warm = warm
        self.affinity_seconds = affinity_seconds

    async def fetch_job(
        self, queues: Iterable[str] | None, worker_id: int
    ) -> procrastinate_jobs.Job | None:
        row = await self.connector.execute_query_one_async(
            query=FETCH_SQL,
            queues=list(queues) if queues is not None else None,
            worker_id=worker_id,
            warm=self.warm.names(),
            affinity_seconds=self.affinity_seconds,
        )
        if row["id"] is None:
            return None
        job = procrastinate_jobs.Job.from_row(row)
        dataset = job.task_kwargs.get("dataset")
        if isinstance(dataset, str):
            self.warm.note(dataset)
        return job
