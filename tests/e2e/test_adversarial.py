"""Adversarial researchers against the real centre: regression tests for the security review.

Each test is a concrete attack that once worked; it must keep failing.
"""

from __future__ import annotations

import json

from e2e_helpers import Centre, open_body, reveal_body, signed

from safeaccess.client.analyses import FrequencyTable, Script
from safeaccess.server.embedded import EmbeddedServer
from safeaccess.server.service import Service

SAFE = FrequencyTable(rows=["region"], cols=["sex"])


def test_a_script_that_crashes_the_sandbox_fails_its_step_and_cannot_be_rerun(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    # A script that ends the runner without a response used to be reported as "sandbox
    # unavailable, retry later" with nothing recorded: the researcher could re-run it without
    # limit, no output checker ever saw it, and whether (or when) it crashed is hers to choose
    # from the data — an unreviewed channel out of the sandbox. It must count as the script's
    # own failure: recorded, the sequence aborted, a retry answered from the record.
    service, srv = server
    crash = Script(code="import os\nos._exit(3 if len(df) > 0 else 0)\n")
    sealed = centre.seal([crash, SAFE])
    body = open_body(sealed)
    first = signed(srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", body)
    assert first.status_code == 201, first.text
    view = first.json()
    assert view["state"] == "failed" and view["sequence_state"] == "aborted"
    assert view["error"]["code"] == "script_crashed"
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
    assert retry.json()["state"] == "failed"
    kinds = [e.kind for e in service.store.events(view["sequence_id"])]
    assert kinds == ["sequence_opened", "step_failed"]


def test_a_script_forging_another_output_type_fails_its_step(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    # The runner's response channel is reachable from the script; a forged table is refused by
    # the backend, and that refusal is the script's failure, not a retryable centre outage.
    _, srv = server
    fake = {
        "ok": True,
        "output": {
            "type": "table",
            "source": "frequency_table",
            "statistic": "count",
            "row_vars": ["sex"],
            "col_vars": [],
            "row_labels": [["F"]],
            "col_labels": [[]],
            "values": [[100.0]],
            "facts": {"cells": {"counts": [[100]]}, "n_total": 100},
        },
    }
    code = (
        f"payload = {json.dumps(fake).encode()!r}\n"
        "import os\n"
        "for fd in range(3, 20):\n"
        "    try:\n"
        "        os.write(fd, payload)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    sealed = centre.seal([Script(code=code), SAFE])
    response = signed(
        srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
    )
    assert response.status_code == 201, response.text
    view = response.json()
    assert view["state"] == "failed" and view["sequence_state"] == "aborted"
    assert view["output"] is None
