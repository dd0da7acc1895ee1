"""Reply padding (`config.timing`, `server/steps/timing.py`): how long a step takes to answer
must not tell what the records are.

The attack: `summary count where <one person> and income >= X` is withheld whatever X (the
answer is one record or none), but a run over one selected record took longer than the refusal
of an empty selection. The sandbox's own gap is milliseconds; here a wrapped backend makes it a
second, as a heavier analysis or the query-set auditor's path would, so the attack is plain to
see: without padding the reply time tells whether her income is at least X (a binary search
then finds it); with padding every probe answers at the same deadline.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest
from e2e_helpers import Centre, WrappedBackend, open_body, serving, signed, unique_person

from safeaccess.client.analyses import FrequencyTable, Summary
from safeaccess.sandbox.backend import Job, RunResult
from safeaccess.server.config import DataDir, TimingConfig
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

SAFE = FrequencyTable(rows=["region"], cols=["sex"])
DELAY = 1.0  # how much longer a run over a non-empty selection takes (the data decides)
DEADLINE = 3.0  # the padded reply time, seconds


class SlowerOnRecords(WrappedBackend):
    """The real sandbox; a run that selected records (it did not fail with `no_rows`) takes
    DELAY longer."""

    def run(self, job: Job) -> RunResult:
        result = self.real.run(job)  # an empty selection raises here, at once
        time.sleep(DELAY)
        return result


@pytest.fixture
def timed_server(centre: Centre, request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """The centre's real server on a slower-on-records backend, with `timing.pad` as asked."""
    data = DataDir(centre.root)
    original = data.load_config()
    pad = bool(request.param)
    data.save_config(
        original.model_copy(
            update={
                "timing": TimingConfig(
                    pad=pad, base_seconds=DEADLINE, seconds_per_million_records=0.0
                )
            }
        )
    )
    probe = Service(centre.root)
    backend = SlowerOnRecords(probe.backend)
    probe.scripts.close()
    probe.store.close()
    try:
        with serving(centre.root, backend=backend) as (_, srv):
            yield srv
    finally:
        data.save_config(original)


def _probe(srv: EmbeddedServer, centre: Centre, researcher: str, where: str) -> tuple[str, float]:
    sealed = centre.seal(
        [Summary(variables=["income"], statistics=["count"], where=where), SAFE],
        researcher=researcher,
    )
    started = time.perf_counter()
    response = signed(
        srv.url, centre.keys[researcher], researcher, "POST", "/v1/sequences", open_body(sealed)
    )
    elapsed = time.perf_counter() - started
    assert response.status_code == 201, response.text
    return response.json()["state"], elapsed


def _published_deadline(srv: EmbeddedServer, centre: Centre, researcher: str) -> float | None:
    response = signed(srv.url, centre.keys[researcher], researcher, "GET", "/v1/datasets")
    assert response.status_code == 200, response.text
    (census,) = [d for d in response.json()["datasets"] if d["name"] == "census"]
    deadline: float | None = census["reply_deadline_seconds"]
    return deadline


def _times(srv: EmbeddedServer, centre: Centre, researcher: str) -> dict[bool, list[float]]:
    person, income = unique_person(centre.census)
    times: dict[bool, list[float]] = {True: [], False: []}
    # The first job of a server starts its sandbox template (seconds, whatever the data): a
    # patient attacker lets it, and so does this one.
    _probe(srv, centre, researcher, f"{person} and income >= 0")
    for at_least in (True, False, True, False):
        x = income - 1 if at_least else income + 1
        state, elapsed = _probe(srv, centre, researcher, f"{person} and income >= {x}")
        assert state == "withheld"  # the same answer either way
        times[at_least].append(elapsed)
    return times


@pytest.mark.parametrize("timed_server", [False], indirect=True)
def test_without_padding_the_reply_time_tells_the_income(
    centre: Centre, timed_server: EmbeddedServer
) -> None:
    assert _published_deadline(timed_server, centre, "ada") is None
    times = _times(timed_server, centre, "ada")
    gap = statistics.median(times[True]) - statistics.median(times[False])
    # The attack works: her income is at least X exactly when the answer is slow.
    assert gap > 0.6 * DELAY, times


@pytest.mark.parametrize("timed_server", [True], indirect=True)
def test_with_padding_every_probe_answers_at_the_deadline(
    centre: Centre, timed_server: EmbeddedServer
) -> None:
    # The catalogue says when to expect every answer.
    assert _published_deadline(timed_server, centre, "bob") == DEADLINE
    times = _times(timed_server, centre, "bob")
    every = times[True] + times[False]
    assert min(every) >= DEADLINE, times
    # Both kinds of probe are held to the same moment; what remains is request noise.
    gap = statistics.median(times[True]) - statistics.median(times[False])
    assert abs(gap) < 0.3 * DELAY, times
    assert max(every) < 2 * DEADLINE, times
