"""`Revealed` (steps/revealed.py): a step's body is parsed once, and accepted or refused exactly
as `parse_analysis` accepts or refuses it, with the same error."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from safeaccess.client.analyses import (
    FrequencyTable,
    MagnitudeTable,
    Mitigations,
    Script,
    parse_analysis,
    to_body,
)
from safeaccess.server.steps.revealed import Revealed, shown_of

VALID = [
    to_body(FrequencyTable(rows=["region"], cols=["sex"])),
    to_body(FrequencyTable(rows=["region"], mitigations=Mitigations(suppress=True))),
    to_body(MagnitudeTable(rows=["region"], value="income", agg="mean")),
    to_body(Script(code="print(1)")),
]
# Bodies a researcher may seal although no client would send them.
ODD = [
    b"",
    b"not json",
    b"[1, 2]",
    b'"frequency_table"',
    b'{"kind": "frequency_table"}',
    b'{"kind": "no_such_kind"}',
    b'{"kind": "frequency_table", "rows": ["region"], "extra": 1}',
    b'{"kind": "frequency_table", "rows": ["region"], "rows": ["sex"]}',
    b'{"kind": "frequency_table", "rows": ["region"], "margins": "yes"}',
    b'{"kind": "frequency_table", "rows": ["region"], "mitigations": []}',
    b'{"kind": "frequency_table", "rows": ["region"]} trailing',
    '{"kind": "frequency_table", "rows": ["region"]}'.encode("utf-16"),
    b'\xef\xbb\xbf{"kind": "frequency_table", "rows": ["region"]}',
    b'{"kind": "frequency_table", "rows": ["\\ud800"]}',
    b'{"kind": "magnitude_table", "rows": ["region"], "value": "income", "agg": NaN}',
    b"\xff\xfe\x00",
]


def _expected(body: bytes) -> tuple[object, list[dict[str, object]] | None]:
    try:
        return parse_analysis(body), None
    except ValidationError as exc:
        return None, exc.errors(include_url=False, include_input=False)


@pytest.mark.parametrize("body", VALID + ODD)
def test_a_body_is_accepted_or_refused_exactly_as_parse_analysis_does(body: bytes) -> None:
    analysis, errors = _expected(body)
    revealed = Revealed.of(b"trace", body, last=True)
    assert revealed.analysis == analysis
    if errors is None:
        assert revealed.error is None
        assert revealed.kind == json.loads(body)["kind"]
    else:
        assert revealed.error is not None and revealed.kind is None
        assert revealed.error.errors(include_url=False, include_input=False) == errors


def test_the_valid_bodies_are_valid() -> None:
    # Guards the table above: the differential test must see accepted bodies too.
    assert all(Revealed.of(b"", b, last=False).analysis is not None for b in VALID)


def test_only_a_script_body_is_a_script() -> None:
    kinds = [Revealed.of(b"", b, last=False).is_script for b in VALID + ODD]
    assert kinds.count(True) == 1
    assert Revealed.of(b"", to_body(Script(code="x = 1")), last=False).is_script


def test_the_view_shows_the_json_object_the_researcher_sent() -> None:
    body = b'{"kind": "frequency_table", "rows": ["region"], "extra": 1}'
    assert Revealed.of(b"", body, last=False).shown == {
        "kind": "frequency_table",
        "rows": ["region"],
        "extra": 1,
    }
    assert shown_of(body) == Revealed.of(b"", body, last=False).shown
    assert shown_of(b"[1]") is None and shown_of(b"not json") is None


def test_the_auditors_json_is_the_validated_analysis() -> None:
    body = VALID[0]
    assert Revealed.of(b"", body, last=False).analysis_json == parse_analysis(body).model_dump(
        mode="json"
    )
    assert Revealed.of(b"", b"[]", last=False).analysis_json is None
