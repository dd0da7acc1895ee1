"""A step's and a sequence's replies over HTTP are their views as the service builds them, each
serialised once (`http/app.py`'s `json_reply`), with the status codes the API documents."""

from __future__ import annotations

import base64

from e2e_helpers import Centre

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.schemas import SequenceView, StepView
from safeaccess.server.service import Service

STEP = FrequencyTable(rows=["region"], cols=["sex"])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_replies_are_the_services_views(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    sealed = centre.seal([STEP, STEP])
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        http = session._http  # the signed client, for the raw replies
        trace, body = sealed.reveal_for(1)
        opened = http.post(
            "/v1/sequences",
            json={
                "header": _b64(sealed.header),
                "signature": _b64(sealed.signature),
                "endorsements": [],
                "trace": trace.hex(),
                "body": _b64(body),
            },
        )
        assert opened.status_code == 201, opened.text
        assert opened.headers["content-type"] == "application/json"
        first = StepView.model_validate_json(opened.content)
        assert first.state == "released"
        sid = first.sequence_id
        assert first == service.step("ada", sid, 1)

        trace, body = sealed.reveal_for(2)
        path = f"/v1/sequences/{sid}/steps/2"
        revealed = http.post(path, json={"trace": trace.hex(), "body": _b64(body)})
        assert revealed.status_code == 200, revealed.text
        second = StepView.model_validate_json(revealed.content)
        assert second == service.step("ada", sid, 2)
        assert second.receipt is not None and second.output is not None

        got = http.get(path)
        assert got.status_code == 200
        assert StepView.model_validate_json(got.content) == second
        listed = http.get(f"/v1/sequences/{sid}")
        assert listed.status_code == 200
        assert SequenceView.model_validate_json(listed.content) == service.sequence("ada", sid)
        # Errors keep their JSON body.
        missing = http.get(f"/v1/sequences/{'0' * 32}/steps/1")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"]
