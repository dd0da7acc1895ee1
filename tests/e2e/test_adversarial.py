"""Adversarial researchers against the real centre: regression tests for the security review.

Each test is a concrete attack that once worked; it must keep failing.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import httpx
import pandas as pd
from e2e_helpers import Centre, open_body, reveal_body, signed

from safeaccess.client.analyses import FrequencyTable, Script, Summary
from safeaccess.client.httpsig import sign_request
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.session import connect
from safeaccess.sandbox.backend import Backend, Job, RunResult
from safeaccess.server.api import create_app
from safeaccess.server.config import DataDir
from safeaccess.server.datasets import register_dataset
from safeaccess.server.embedded import EmbeddedServer
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
    assert kinds == ["sequence_opened", "step_review", "script_run_finished"]


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
MEAN_SD = Summary(variables=["score"], statistics=["mean", "sd"], by=["site"], round=2)
MEDIAN = Summary(variables=["score"], statistics=["median"], by=["site"], round=2)


class Rendezvous:
    """The real sandbox, holding each job until a second one is running too (or a timeout):
    two reveals then run their jobs side by side, as a researcher with two sequences can make
    them do."""

    def __init__(self, real: Backend):
        self.real = real
        self.name = real.name
        self.enabled = False
        self._barrier = threading.Barrier(2)

    def check_available(self) -> None:
        self.real.check_available()

    def run(self, job: Job) -> RunResult:
        if self.enabled:
            with contextlib.suppress(threading.BrokenBarrierError):
                self._barrier.wait(timeout=5)
        return self.real.run(job)

    def close(self) -> None:
        self.real.close()


def test_two_sequences_at_once_cannot_dodge_the_release_history(centre: Centre) -> None:
    # The checks combine a new output with what was released to the researcher before; a step
    # whose job ran while another of her sequences was still computing used to be checked
    # without that other output, so two sequences revealed at once released a pair of summaries
    # that one sequence could not.
    data = DataDir(centre.root)
    frame = pd.DataFrame(
        {
            "site": ["A"] * len(SITE_A) + ["B"] * 60,
            "score": SITE_A + [1 + (i * 7) % 5 for i in range(60)],
        }
    )
    meta = DatasetMetadata(
        name="scores",
        columns=[
            Column(name="site", type="categorical", levels=["A", "B"]),
            Column(name="score", type="ordinal", levels=[1, 2, 3, 4, 5], scale=(1, 5)),
        ],
    )
    store = Store(data.database_url(data.load_config()))
    try:
        register_dataset(data, store, name="scores", frame=frame, metadata=meta, project="p1")
    finally:
        store.close()
    probe = Service(centre.root)
    sandbox = Rendezvous(probe.backend)
    probe.store.close()
    service = Service(centre.root, backend=sandbox)
    with service, EmbeddedServer(create_app(service)) as srv:
        # Control: one after the other (bob), the second summary is withheld.
        with connect(srv.url, centre.keys["bob"], "bob") as session:
            steps = session.run(centre.seal([MEAN_SD, MEDIAN], researcher="bob", dataset="scores"))
        assert [s.status for s in steps] == ["released", "withheld"]

        # Attack: the same two summaries as the first steps of two sequences, revealed at once.
        sandbox.enabled = True
        statuses: list[str] = []

        def reveal(analysis: Summary) -> None:
            with connect(srv.url, centre.keys["ada"], "ada") as session:
                sealed = centre.seal([analysis, SAFE], dataset="scores")
                statuses.append(session.run(sealed)[0].status)

        threads = [threading.Thread(target=reveal, args=(a,)) for a in (MEAN_SD, MEDIAN)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(statuses) == ["released", "withheld"], statuses


def test_an_output_waiting_for_review_counts_as_released_for_later_checks(
    centre: Centre, tmp_path: Path
) -> None:
    # An output in review may still be released by a checker who sees only its own findings.
    # Steps checked meanwhile used to ignore it, so: summary 1 goes to review (a missing-value
    # note on another variable), summary 2 is released because summary 1 is not yet released,
    # the checker approves summary 1 — and together they pin down site A's values.
    data = DataDir(centre.root)
    n = len(SITE_A) + 60
    frame = pd.DataFrame(
        {
            "site": ["A"] * len(SITE_A) + ["B"] * 60,
            "score": SITE_A + [1 + (i * 7) % 5 for i in range(60)],
            "extra": [None if i % 9 == 0 else float(20 + (i * 13) % 31) for i in range(n)],
        }
    )
    meta = DatasetMetadata(
        name="scores_review",
        columns=[
            Column(name="site", type="categorical", levels=["A", "B"]),
            Column(name="score", type="ordinal", levels=[1, 2, 3, 4, 5], scale=(1, 5)),
            Column(name="extra", type="continuous"),
        ],
    )
    rules = tmp_path / "rules.yaml"
    rules.write_text("missing_values: review\n")
    store = Store(data.database_url(data.load_config()))
    try:
        register_dataset(
            data,
            store,
            name="scores_review",
            frame=frame,
            metadata=meta,
            project="p1",
            rules_file=rules,
        )
    finally:
        store.close()
    with_extra = Summary(
        variables=["score", "extra"], statistics=["mean", "sd"], by=["site"], round=2
    )
    with Service(centre.root) as service, EmbeddedServer(create_app(service)) as srv:
        with connect(srv.url, centre.keys["ada"], "ada") as session:
            first = session.run(centre.seal([with_extra, SAFE], dataset="scores_review"))
            assert [s.status for s in first] == ["review"]
        # Control: the median alone is released to a researcher without the pending summary.
        with connect(srv.url, centre.keys["bob"], "bob") as session:
            alone = session.run(
                centre.seal([MEDIAN, SAFE], researcher="bob", dataset="scores_review")
            )
            assert alone[0].status == "released"
        with connect(srv.url, centre.keys["ada"], "ada") as session:
            second = session.run(centre.seal([MEDIAN, SAFE], dataset="scores_review"))
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
forged = b"SAR1" + len(body).to_bytes(4, "big") + body + (0).to_bytes(4, "big")
for fd in range(3, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
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
    assert [f["check"] for f in recorded.decision["findings"]] == ["differencing"]
    # The same pair the other way round, in a new sequence: the second is withheld too.
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        steps = session.run(centre.seal([all_but_one, everyone, SAFE], researcher="bob"))
    assert [s.status for s in steps] == ["released", "withheld"]


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
