"""The researcher's side over real HTTP: result frames for several output kinds, the catalogue,
and the `safeaccess run` command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import Centre

from safeaccess.client.analyses import Correlation, FrequencyTable, MagnitudeTable
from safeaccess.client.cli import main as client_main
from safeaccess.client.keys import load_private_key
from safeaccess.client.session import WrongServer, connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def test_frames_for_tables_with_margins_correlations_and_means(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    _, srv = server
    census = centre.census
    sealed = centre.seal(
        [
            FrequencyTable(rows=["region"], cols=["sex"], margins=True),
            Correlation(variables=["age", "income"]),
            MagnitudeTable(value="income", agg="mean", rows=["sex"], where="age >= 18"),
        ]
    )
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        results = session.run(sealed)
    assert [r.status for r in results] == ["released"] * 3, [r.describe() for r in results]

    table = results[0].frame()
    assert table.loc["All", "All"] == len(census)
    assert table.loc["North", "F"] == int(((census.region == "North") & (census.sex == "F")).sum())

    corr = results[1].frame()
    both = census[["age", "income"]].dropna()
    expected = np.corrcoef(both["age"].to_numpy(float), both["income"].to_numpy(float))[0, 1]
    assert corr.loc["age", "income"] == pytest.approx(expected, rel=1e-9)

    means = results[2].frame()
    adults = census[census.age >= 18]
    for sex in ("F", "M"):
        values = adults.loc[adults.sex == sex, "income"].dropna().to_numpy(float)
        assert means.loc[sex].iloc[0] == pytest.approx(values.sum() / len(values), rel=1e-9)


def test_run_refuses_a_sequence_for_another_server_before_revealing(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    before = len(service.store.list_sequences("ada"))
    with connect(srv.url, centre.keys["ada"], "ada") as session, pytest.raises(WrongServer):
        session.run(centre.seal([FrequencyTable(rows=["sex"])], server="elsewhere"))
    assert len(service.store.list_sequences("ada")) == before


def test_safeaccess_run_command(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    _, srv = server
    key_file = tmp_path / "ada.key"
    key_file.write_bytes(
        centre.keys["ada"].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    assert load_private_key(key_file) is not None
    sealed_file = tmp_path / "seq.json"
    sealed_file.write_text(
        centre.seal(
            [FrequencyTable(rows=["sex"]), FrequencyTable(rows=["ethnicity"], cols=["region"])]
        ).to_json()
    )
    args = [str(sealed_file), "--server", srv.url, "--key", str(key_file), "--researcher", "ada"]
    assert client_main(["run", *args]) == 1
    out = capsys.readouterr().out
    assert "step 1 (frequency_table): RELEASED" in out
    assert "step 2 (frequency_table): WITHHELD" in out and "disclosure_control" in out
    assert "stopped at step 2 (withheld)" in out
    # Running the same file again resumes the (aborted) sequence rather than opening it twice,
    # here with the centre's key pinned from a PEM file.
    from safeaccess.client.keys import public_key_text

    pem = tmp_path / "centre.pub"
    pem.write_text(public_key_text(server[0].signing_key.public_key()))
    assert client_main(["run", *args, "--server-key", str(pem)]) == 1
    assert "stopped at step 2 (withheld)" in capsys.readouterr().out
    other = tmp_path / "other.pub"
    other.write_text(public_key_text(Ed25519PrivateKey.generate().public_key()))
    assert client_main(["run", *args, "--server-key", str(other)]) == 2
    assert "different signing key" in capsys.readouterr().err


def test_receipts_bind_the_outcome_and_are_signed_by_the_centre(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    import dataclasses

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from safeaccess.client.results import ReceiptInvalid, verify_receipt

    service, srv = server
    server_key = service.signing_key.public_key()
    sealed = centre.seal(
        [FrequencyTable(rows=["sex"]), FrequencyTable(rows=["ethnicity"], cols=["region"])]
    )
    with connect(srv.url, centre.keys["ada"], "ada", server_key=server_key) as session:
        released, withheld = session.run(sealed)  # run() checks every receipt itself
    for result in (released, withheld):
        verify_receipt(result, server_key, sealed)
    assert withheld.receipt is not None and withheld.receipt["fields"]["state"] == "withheld"
    # A withheld output has no opening: the receipt carries the log's salted (hiding)
    # commitment, so it proves the withhold; nothing in a receipt is a bare hash of an output.
    assert isinstance(withheld.receipt["fields"]["output_commitment"], str)
    assert withheld.receipt["fields"]["output_opening"] is None
    assert "output_sha256" not in released.receipt["fields"]  # type: ignore[index]

    assert released.output is not None
    altered = dict(released.output, values=[[1.0]] * len(released.output["values"]))
    with pytest.raises(ReceiptInvalid, match="output_commitment"):
        verify_receipt(dataclasses.replace(released, output=altered), server_key, sealed)
    with pytest.raises(ReceiptInvalid, match="not signed"):
        verify_receipt(released, Ed25519PrivateKey.generate().public_key(), sealed)
    other = centre.seal([FrequencyTable(rows=["sex"])])
    with pytest.raises(ReceiptInvalid, match=r"body_sha256|header_sha256|trace_sha256"):
        verify_receipt(released, server_key, other)

    impostor = Ed25519PrivateKey.generate().public_key()
    with (
        connect(srv.url, centre.keys["ada"], "ada", server_key=impostor) as session,
        pytest.raises(WrongServer, match="different signing key"),
    ):
        session.run(centre.seal([FrequencyTable(rows=["sex"])]))


def test_a_server_that_is_down_is_one_line_not_a_traceback(
    centre: Centre, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    from cryptography.hazmat.primitives import serialization
    from e2e_helpers import free_port

    from safeaccess.client.session import Unreachable

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with connect(url, centre.keys["ada"], "ada") as session, pytest.raises(Unreachable) as info:
        session.datasets()
    assert str(info.value) == f"cannot reach {url}: connection refused"
    assert time.monotonic() - started < 5  # a server never reached is not retried for long

    key_file = tmp_path / "ada.key"
    key_file.write_bytes(
        centre.keys["ada"].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    sealed_file = tmp_path / "seq.json"
    sealed_file.write_text(centre.seal([FrequencyTable(rows=["sex"])]).to_json())
    common = ["--server", url, "--key", str(key_file)]
    for argv in (
        ["run", str(sealed_file), *common, "--researcher", "ada"],
        ["audit", "receipt", str(sealed_file), *common, "--researcher", "ada"],
    ):
        assert client_main(argv) == 2
        captured = capsys.readouterr()
        assert captured.err == f"safeaccess: error: cannot reach {url}: connection refused\n"
        assert "Traceback" not in captured.out


@pytest.mark.parametrize("part", ["body", "trace", "t0"])
def test_run_refuses_a_tampered_sealed_file_before_revealing_step_1(
    centre: Centre, server: tuple[Service, EmbeddedServer], part: str
) -> None:
    """With step 2's body or trace (or T_0) altered, nothing is opened or revealed: otherwise
    step 1 is released and the sequence is stuck open at a step 2 that cannot verify."""
    from safeaccess.client.session import TamperedSequence

    service, srv = server
    sealed = centre.seal([FrequencyTable(rows=["sex"]), FrequencyTable(rows=["region"])])
    traces, bodies = list(sealed.traces), list(sealed.bodies)
    if part == "body":
        bodies[1] = bodies[1].replace(b"region", b"sex")
    elif part == "trace":
        traces[2] = bytes([traces[2][0] ^ 1]) + traces[2][1:]
    else:
        traces[0] = bytes([traces[0][0] ^ 1]) + traces[0][1:]
    bad = sealed.model_copy(update={"traces": tuple(traces), "bodies": tuple(bodies)})
    before = len(service.store.list_sequences("ada"))
    with (
        connect(srv.url, centre.keys["ada"], "ada") as session,
        pytest.raises(TamperedSequence, match="nothing was revealed"),
    ):
        session.run(bad)
    assert len(service.store.list_sequences("ada")) == before


def test_serve_logs_the_cause_of_an_authentication_failure(centre: Centre, tmp_path: Path) -> None:
    """The answer is one for every cause; the cause goes to the server's log under `serve`."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from e2e_helpers import free_port, serve_in_subprocess, signed

    port = free_port()
    errors = tmp_path / "serve.log"
    proc = serve_in_subprocess(centre.root, port, stderr=errors)
    try:
        response = signed(
            f"http://127.0.0.1:{port}",
            Ed25519PrivateKey.generate(),
            "nobody",
            "GET",
            "/v1/sequences",
        )
        assert response.status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)
    log = errors.read_text()
    assert "authentication failed (" in log and "nobody" in log, log
