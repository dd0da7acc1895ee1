"""Several researchers at once: every sequence completes, and the job limit holds."""

from __future__ import annotations

import threading

from e2e_helpers import Centre, WrappedBackend

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.sandbox.backend import Backend, Job, RunResult
from safeaccess.server.config import DataDir
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


class CountingSandbox(WrappedBackend):
    """The real backend, recording how many jobs ran at the same time."""

    def __init__(self, real: Backend):
        super().__init__(real)
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def run(self, job: Job) -> RunResult:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            return self.real.run(job)
        finally:
            with self._lock:
                self.running -= 1


def test_concurrent_researchers_complete_within_the_job_limit(centre: Centre) -> None:
    data = DataDir(centre.root)
    data.save_config(data.load_config().model_copy(update={"max_concurrent_jobs": 2}))
    probe = Service(centre.root)
    sandbox = CountingSandbox(probe.backend)
    probe.store.close()
    service = Service(centre.root, backend=sandbox)
    results: list[tuple[str, list[StepResult]]] = []
    analyses = [FrequencyTable(rows=["region"]), FrequencyTable(rows=["sex"])]

    def researcher(name: str) -> None:
        with connect(srv.url, centre.keys[name], name) as session:
            results.append((name, session.run(centre.seal(analyses, researcher=name))))

    names = ["ada", "bob", "ada", "bob"]
    with service, EmbeddedServer(create_app(service)) as srv:
        threads = [threading.Thread(target=researcher, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(n for n, _ in results) == sorted(names)
    assert all([r.status for r in rs] == ["released", "released"] for _, rs in results)
    assert len({rs[0].sequence_id for _, rs in results}) == 4
    # Four sequences asked at once; never more than two jobs ran together (and two did).
    assert sandbox.peak == 2
