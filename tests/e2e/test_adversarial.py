"""Adversarial researchers against the real centre: regression tests for the security review.

Each test is a concrete attack that once worked; it must keep failing.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import httpx
import pandas as pd
from e2e_helpers import Centre, WrappedBackend, open_body, reveal_body, serving, signed

from safeaccess.client.analyses import FrequencyTable, Script, Summary
from safeaccess.client.httpsig import sign_request
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.session import connect
from safeaccess.sandbox.backend import Backend, Job, RunResult
from safeaccess.server.config import DataDir
from safeaccess.server.datasets import register_dataset
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

SAFE = FrequencyTable(rows=["region"], cols=["sex"])


def test_a_script_that_crashes_the_sandbox_fails_its_step_and_cannot_be_rerun(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    # A script that ends the runner without a response used to be reported as "sandbox
    # unavailable, retry later" with nothing recorded: the researcher could re-run it without
    # limit, no output checker ever saw it, and whether (or when) it crashed is hers to choose
    # from the data — an unreviewed channel out of the sandbox. It must count as the script's
    # own failure, recorded for the output checkers only (scripts are answered "in review" before
    # they run; the researcher never learns that it crashed), and a retry answered from the record.
    service, srv = server
    crash = Script(code="import os\nos._exit(3 if len(df) > 0 else 0)\n")
    sealed = centre.seal([crash, SAFE])
    body = open_body(sealed)
    first = signed(srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", body)
    assert first.status_code == 201, first.text
    view = first.json()
    assert view["state"] == "review" and view["sequence_state"] == "review"
    assert view["error"] is None
    assert service.scripts.wait_idle(120)
    recorded = service.store.get_step(view["sequence_id"], 1)
    assert recorded is not None and recorded.error_code == "script_crashed"
    # Retrying the reveal of step 1 (what "retry the same reveal later" invited) answers from the
    # record and runs nothing.
    retry = signed(
        srv.url,
        centre.keys["ada"],
        "ada",
        "POST",
        f"/v1/sequences/{view['sequence_id']}/steps/1",
        reveal_body(sealed, 1),
    )
    assert retry.status_code == 200, retry.text
    assert retry.json()["state"] == "review" and retry.json()["error"] is None
    assert retry.json()["updated_at"] == view["updated_at"]
    kinds = [e.kind for e in service.store.events(view["sequence_id"])]
    # Recorded in review at the reveal, and nothing else: the run's result is held on the step
    # for the checkers (it enters the log with their first action on it, never at its own end).
    assert kinds[0] == "sequence_opened" and kinds[-1] == "step_review"
    assert kinds.count("step_review") == 1 and "step_failed" not in kinds
    assert "script_run_finished" not in kinds
    assert recorded.run_event is not None
    assert recorded.run_event["script_run"]["error_code"] == "script_crashed"


def test_a_script_forging_another_output_type_fails_its_step(
    centre: Centre, server: tuple[Service, EmbeddedServer], forged_table_script: str
) -> None:
    # The runner's response channel is reachable from the script; a forged table is refused by
    # the backend, and that refusal is the script's failure (for checkers), not a retryable centre
    # outage.
    service, srv = server
    code = forged_table_script
    sealed = centre.seal([Script(code=code), SAFE])
    response = signed(
        srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
    )
    assert response.status_code == 201, response.text
    view = response.json()
    assert view["state"] == "review" and view["sequence_state"] == "review"
    assert view["output"] is None
    assert service.scripts.wait_idle(120)
    recorded = service.store.get_step(view["sequence_id"], 1)
    assert recorded is not None and recorded.error_code is not None and recorded.output is None


# A 5-point score for site A (24 records) whose mean+SD alone and median alone pass every check,
# but which together fit one set of values only (found by enumerating every count vector).
SITE_A = [3] * 3 + [4] * 8 + [5] * 13


class Rendezvous(WrappedBackend):
    """The real sandbox, holding each job until a second one is running too (or a timeout):
    two reveals then run their jobs side by side, as a researcher with two sequences can make
    them do."""

    def __init__(self, real: Backend):
        super().__init__(real)
        self.enabled = False
        self._barrier = threading.Barrier(2)

    def run(self, job: Job) -> RunResult:
        if self.enabled:
            with contextlib.suppress(threading.BrokenBarrierError):
                self._barrier.wait(timeout=5)
        return self.real.run(job)


def _register_people(centre: Centre, name: str, rules: Path | None = None) -> None:
    """84 people at two sites; one of them, and only she, is aged 90."""
    data = DataDir(centre.root)
    n = len(SITE_A) + 60
    frame = pd.DataFrame(
        {
            "pid": range(1, n + 1),
            "site": ["A"] * len(SITE_A) + ["B"] * 60,
            "age": [90] + [30 + i % 40 for i in range(1, n)],
            "extra": [None if i % 9 == 0 else float(20 + (i * 13) % 31) for i in range(n)],
        }
    )
    meta = DatasetMetadata(
        name=name,
        record_key="pid",
        columns=[
            Column(name="pid", type="identifier"),
            Column(name="site", type="categorical", levels=["A", "B"]),
            Column(name="age", type="integer"),
            Column(name="extra", type="continuous"),
        ],
    )
    store = Store(data.database_url(data.load_config()))
    try:
        register_dataset(
            data, store, name=name, frame=frame, metadata=meta, project="p1", rules_file=rules
        )
    finally:
        store.close()


EVERYONE = FrequencyTable(rows=["site"])
ALL_BUT_ONE = FrequencyTable(rows=["site"], where="age != 90")


def test_two_sequences_at_once_cannot_dodge_the_audit(centre: Centre) -> None:
    # Each output is admitted against everything admitted before in its scope; a step whose job
    # ran while another sequence of the project was still computing must not be admitted
    # against a state without that other output, or two sequences revealed at once would
    # release together the pair (everyone, everyone but one) that one sequence cannot.
    _register_people(centre, "people_at_once")
    probe = Service(centre.root)
    sandbox = Rendezvous(probe.backend)
    probe.store.close()
    with serving(centre.root, backend=sandbox) as (_, srv):
        sandbox.enabled = True
        statuses: list[str] = []

        def reveal(analysis: FrequencyTable) -> None:
            with connect(srv.url, centre.keys["ada"], "ada") as session:
                sealed = centre.seal([analysis, SAFE], dataset="people_at_once")
                statuses.append(session.run(sealed)[0].status)

        threads = [threading.Thread(target=reveal, args=(a,)) for a in (EVERYONE, ALL_BUT_ONE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(statuses) == ["released", "withheld"], statuses


def test_an_output_waiting_for_review_counts_as_released_for_later_checks(
    centre: Centre, tmp_path: Path
) -> None:
    # An output in review may still be released by a checker who sees only its own findings, so
    # it is admitted into the audit state when it goes to review: the table of everyone goes to
    # review (a missing-value note), and the table of everyone but one is withheld meanwhile.
    rules = tmp_path / "rules.yaml"
    rules.write_text("missing_values: review\n")
    _register_people(centre, "people_review", rules)
    with_extra = Summary(variables=["extra"], statistics=["mean"], by=["site"])
    with Service(centre.root) as service, EmbeddedServer(create_app(service)) as srv:
        with connect(srv.url, centre.keys["ada"], "ada") as session:
            first = session.run(centre.seal([with_extra, SAFE], dataset="people_review"))
            assert [s.status for s in first] == ["review"]
        with connect(srv.url, centre.keys["ada"], "ada") as session:
            second = session.run(
                centre.seal(
                    [
                        Summary(
                            variables=["extra"], statistics=["mean"], by=["site"], where="age != 90"
                        ),
                        SAFE,
                    ],
                    dataset="people_review",
                )
            )
        assert second[0].status == "withheld", second[0]


def test_a_script_cannot_choose_the_error_code_its_researcher_sees(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    # A failed script's message is withheld (it could quote data) but its error code used to be
    # passed on, and a script can answer on the runner's response pipe itself: a forged error
    # whose code carries data reached the researcher with no output check.
    service, srv = server
    code = """
import json, os, stat
secret = "leak" + str(int(df["income"].sum()))
body = json.dumps({"ok": False, "error": {"code": secret, "message": "x"}}).encode()
forged = b"SAR2" + len(body).to_bytes(4, "big") + body + (0).to_bytes(4, "big")
for fd in range(3, 64):
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):  # a pipe, or the fork server's channel
            os.write(fd, forged)
    except OSError:
        pass
os._exit(0)
"""
    sealed = centre.seal([Script(code=code), SAFE])
    response = signed(
        srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
    )
    assert response.status_code == 201, response.text
    view = response.json()
    assert view["state"] == "review" and view["error"] is None
    assert service.scripts.wait_idle(120)
    secret = str(int(centre.census["income"].sum()))
    later = signed(
        srv.url, centre.keys["ada"], "ada", "GET", f"/v1/sequences/{view['sequence_id']}/steps/1"
    )
    assert secret not in response.text and secret not in later.text
    assert later.json() == view
    recorded = service.store.get_step(view["sequence_id"], 1)
    assert recorded is not None and recorded.error_code == "script_failed"


def test_a_mean_over_everyone_but_one_person_is_not_released_after_the_mean_over_everyone(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    # Two means, each over thousands of records, passed every check; their difference is one
    # person's income, exactly. The second must be withheld.
    _, srv = server
    census = centre.census
    keys = ["region", "sex", "age", "ethnicity"]
    sizes = census.groupby(keys, observed=True).size()
    region, sex, age, ethnicity = sizes[sizes == 1].index[0]
    person = (
        f"region == '{region}' and sex == '{sex}' and age == {age} and ethnicity == '{ethnicity}'"
    )
    everyone = Summary(variables=["income"], statistics=["mean"])
    all_but_one = Summary(variables=["income"], statistics=["mean"], where=f"not ({person})")
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        steps = session.run(centre.seal([everyone, all_but_one, SAFE]))
    assert [s.status for s in steps] == ["released", "withheld"]
    assert [r.check for r in steps[1].reasons] == ["disclosure_control"]
    recorded = server[0].store.get_step(steps[1].sequence_id, 2)
    assert recorded is not None and recorded.decision is not None
    assert [f["check"] for f in recorded.decision["findings"]] == ["query_set"]
    # bob, of the same project, shares the audit state: the two means are already combined.
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        steps = session.run(centre.seal([all_but_one, everyone, SAFE], researcher="bob"))
    assert [s.status for s in steps] == ["withheld"]


def test_requests_are_bound_to_this_server(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    # A signed request copied to another centre (where the researcher has the same key) used to
    # be accepted there, disclosing her sequences and outputs at that centre.
    _, srv = server
    key = centre.keys["ada"]
    for_other = sign_request("GET", "/v1/sequences", "", b"", key, "ada", server="other-centre")
    refused = httpx.get(srv.url + "/v1/sequences", headers=for_other, timeout=60)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthenticated"
    # The client tags what it sends with the server's id, so its requests are bound too.
    seen: list[str] = []
    with connect(srv.url, key, "ada") as session:
        session._http.event_hooks["request"].append(
            lambda request: seen.append(request.headers.get("Signature-Input", ""))
        )
        session.sequences()
    assert any(f';tag="{centre.server_id}"' in s for s in seen), seen
