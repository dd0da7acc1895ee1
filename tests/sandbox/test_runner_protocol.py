"""The runner's stdin/stdout protocol, its error reporting and the script kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import ScriptOutput
from safeaccess.sandbox.backend import RunnerRequest, RunnerResponse, decode_reply
from safeaccess.sandbox.runner import execute, run_request
from safeaccess.sandbox.runner.compute.script import MAX_STDOUT_CHARS, ScriptRaised

SECRET = "Zebedee-Quarterhorse"
META = {
    "name": "p",
    "columns": [
        {"name": "name", "type": "identifier"},
        {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
        {"name": "income", "type": "continuous"},
    ],
}
FRAME = pd.DataFrame(
    {"name": [SECRET, "b", "c", "d"], "sex": ["F", "M", "F", "M"], "income": [1.0, 2.0, 3.0, 4.0]}
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("runner") / "p.parquet"
    FRAME.to_parquet(path)
    return path


def call_runner(payload: bytes) -> RunnerResponse:
    done = subprocess.run(
        [sys.executable, "-m", "safeaccess.sandbox.runner"],
        input=payload,
        capture_output=True,
        timeout=120,
        check=True,
    )
    reply = decode_reply(done.stdout)
    assert reply is not None, done.stdout[:200]
    return reply.response


def request(analysis: dict, dataset: Path) -> bytes:
    return (
        RunnerRequest(analysis=analysis, metadata=META, dataset_path=str(dataset))
        .model_dump_json()
        .encode()
    )


def test_runner_round_trip_and_errors(dataset: Path) -> None:
    ok = call_runner(request({"kind": "frequency_table", "rows": ["sex"]}, dataset))
    assert ok.ok and ok.output is not None and ok.output.type == "table"
    assert ok.output.values == [[2.0], [2.0]]

    cases: dict[str, dict] = {
        "bad_filter": {"kind": "frequency_table", "rows": ["sex"], "where": "income >>> 3"},
        "unknown_variable": {"kind": "frequency_table", "rows": ["nosuch"]},
        "not_numeric": {"kind": "summary", "variables": ["name"]},
        "no_rows": {"kind": "frequency_table", "rows": ["sex"], "where": "income > 100"},
        "bad_analysis": {"kind": "frequency_table"},
    }
    for code, analysis in cases.items():
        response = call_runner(request(analysis, dataset))
        assert not response.ok and response.error is not None
        assert response.error.code == code, (code, response.error)
        assert SECRET not in response.error.message
        assert "Traceback" not in response.error.message


def test_runner_rejects_bad_requests_and_missing_datasets(tmp_path: Path) -> None:
    bad = call_runner(b"{not json")
    assert not bad.ok and bad.error is not None and bad.error.code == "bad_request"
    missing = call_runner(request({"kind": "frequency_table", "rows": ["sex"]}, tmp_path / "x"))
    assert missing.error is not None and missing.error.code == "dataset_unreadable"


def test_filter_error_does_not_quote_data(dataset: Path) -> None:
    response = call_runner(
        request({"kind": "frequency_table", "rows": ["sex"], "where": "name > 3"}, dataset)
    )
    assert not response.ok and response.error is not None
    assert response.error.code == "bad_filter"
    assert SECRET not in response.error.message


def run_script(code: str) -> ScriptOutput:
    out = execute(
        parse_analysis({"kind": "script", "code": code}),
        FRAME,
        DatasetMetadata.model_validate(META),
    )
    assert isinstance(out, ScriptOutput)
    return out


def test_script_captures_stdout_and_json_result() -> None:
    out = run_script(
        "print(len(df)); print(df.income.sum())\nresult = {'m': float(df.income.mean())}"
    )
    assert out.stdout == "4\n10.0\n"
    assert out.result == {"m": 2.5}
    assert out.facts.stdout_bytes == len(out.stdout.encode())


def test_script_filter_and_unserialisable_result() -> None:
    out = execute(
        parse_analysis({"kind": "script", "code": "result = object()", "where": "income > 2"}),
        FRAME,
        DatasetMetadata.model_validate(META),
    )
    assert isinstance(out, ScriptOutput)
    assert out.result is None
    assert "not JSON-serialisable" in out.stdout


def test_a_script_that_raises_fails_and_tells_nothing_but_the_exception_type() -> None:
    # It used to return its traceback as output, approvable like any other: the traceback
    # named the runner's install path, and the script chose its exception's text.
    with pytest.raises(ScriptRaised) as raised:
        run_script(f"print('{SECRET}')\nraise ValueError('{SECRET}')")
    assert str(raised.value) == "ValueError"
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    response = run_request(
        RunnerRequest(
            analysis={"kind": "script", "code": f"raise ValueError('{SECRET}')"},
            metadata=META,
            dataset_path="unused",
        ),
        FRAME,
    )
    assert not response.ok and response.error is not None
    assert response.error.code == "script_raised"
    assert SECRET not in response.error.message and "/" not in response.error.message


def test_script_stdout_is_capped() -> None:
    out = run_script(f"print('y' * {MAX_STDOUT_CHARS + 5000})")
    assert len(out.stdout) < MAX_STDOUT_CHARS + 200
    assert "output truncated" in out.stdout


def test_response_json_has_no_nan() -> None:
    out = execute(
        parse_analysis(
            {
                "kind": "summary",
                "variables": ["income"],
                "statistics": ["sd"],
                "where": "income > 3",
            }
        ),
        FRAME,
        DatasetMetadata.model_validate(META),
    )
    text = RunnerResponse(ok=True, output=out).model_dump_json()
    assert "NaN" not in text
    assert json.loads(text)["output"]["groups"][0]["variables"][0]["stats"]["sd"] is None
