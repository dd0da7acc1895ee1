"""A revealed step's body is decoded once on the server (issue 21: it was 3 to 5 times).

Counts, during one step served over HTTP, every call that decodes the step's body bytes: the
standard JSON parser, pydantic's JSON parser and the analysis adapter's `validate_json`."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pydantic_core
import pytest
from e2e_helpers import Centre

from safeaccess.client import analyses
from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

STEP = FrequencyTable(rows=["employment"], cols=["sex"])


class _CountingAdapter:
    """The analysis adapter, counting the JSON decodes of `body`."""

    def __init__(self, real: Any, body: bytes, seen: Counter[str]):
        self.real, self.body, self.seen = real, body, seen

    def validate_json(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        if data == self.body:
            self.seen["validate_json"] += 1
        return self.real.validate_json(data, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_step_body_is_decoded_once(
    centre: Centre, server: tuple[Service, EmbeddedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, srv = server
    body = to_body(STEP)
    sealed = centre.seal([STEP])
    seen: Counter[str] = Counter()
    real_loads, real_from_json = json.loads, pydantic_core.from_json

    def loads(data: Any, *args: Any, **kwargs: Any) -> Any:
        if data in (body, body.decode()):
            seen["json.loads"] += 1
        return real_loads(data, *args, **kwargs)

    def from_json(data: Any, *args: Any, **kwargs: Any) -> Any:
        if data == body:
            seen["from_json"] += 1
        return real_from_json(data, *args, **kwargs)

    monkeypatch.setattr(json, "loads", loads)
    monkeypatch.setattr(pydantic_core, "from_json", from_json)
    monkeypatch.setattr(analyses, "_ADAPTER", _CountingAdapter(analyses._ADAPTER, body, seen))
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        seen.clear()  # the client's own parsing of what it sealed is not the server's
        result = session.open(sealed)
    monkeypatch.undo()
    assert result.status == "released"
    assert result.analysis == real_loads(body)  # the view still shows what was sent
    assert sum(seen.values()) == 1, dict(seen)
