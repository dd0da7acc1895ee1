"""`ca_bundle=` / `--ca-bundle`: the client trusts the CA that issued a centre's TLS certificate
(a centre with its own CA), and only when told to; a bundle it cannot read is a clear error."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.cli import EXIT_USER_ERROR
from safeaccess.client.cli import main as client_main
from safeaccess.client.session import Unreachable, connect, tls_verify
from tls_certs import make_tls


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "server_id": "tls-test"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on loopback with a certificate of a CA of the test's own: (URL, CA)."""
    folder = tmp_path_factory.mktemp("tls")
    ca_file, pem = make_tls(folder)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pem)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca_file
    finally:
        server.shutdown()
        server.server_close()


def test_the_centres_ca_is_trusted_only_when_given(https: tuple[str, Path]) -> None:
    url, ca_file = https
    key = Ed25519PrivateKey.generate()
    with connect(url, key, "ada", ca_bundle=ca_file) as session:
        assert session.health()["server_id"] == "tls-test"
    with connect(url, key, "ada") as session, pytest.raises(Unreachable) as refused:
        session.health()  # the system's CAs do not know the test CA
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)


def test_the_bundle_replaces_the_system_cas_and_checks_names(https: tuple[str, Path]) -> None:
    _, ca_file = https
    verify = tls_verify(ca_file)
    assert isinstance(verify, ssl.SSLContext)
    assert [c["subject"] for c in verify.get_ca_certs()] == [
        ((("commonName", "safeaccess test CA"),),)
    ]
    assert verify.verify_mode == ssl.CERT_REQUIRED and verify.check_hostname
    assert tls_verify(None) is True


def test_a_bundle_that_cannot_be_read_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for bad in (tmp_path / "missing.pem", garbage):
        with pytest.raises(OSError, match=f"cannot read the CA bundle {bad}"):
            tls_verify(bad)
    key = tmp_path / "eve.key"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    args = ["audit", "verify", "--server", "https://127.0.0.1:9", "--key", str(key)]
    code = client_main([*args, "--auditor", "eve", "--ca-bundle", str(garbage)])
    assert code == EXIT_USER_ERROR
    assert f"cannot read the CA bundle {garbage}" in capsys.readouterr().err
