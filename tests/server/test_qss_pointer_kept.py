"""The scope's state pointer kept in process on SQLite (`ScopeAuditor.pointer`): an admission
after this process's own reads no pointer, and a pointer moved by another process on the same
file (stale here) is caught by the step's guarded UPDATE, read again and admitted against."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import event

from replica_helpers import one_researcher_centre, researcher_scope
from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

TABLES = [
    FrequencyTable(rows=["region"], cols=["sex"]),
    FrequencyTable(rows=["region"]),
    FrequencyTable(rows=["sex"]),
]


def _centre(tmp_path: Path) -> tuple[Path, str, Ed25519PrivateKey, str]:
    root = tmp_path / "data"
    url = f"sqlite:///{tmp_path / 'centre.db'}"
    key = Ed25519PrivateKey.generate()
    one_researcher_centre(
        root,
        url,
        key,
        server_id="kept",
        dataset="census",
        frame=generate_census(2000, seed=5),
        metadata=census_metadata("census"),
    )
    return root, url, key, researcher_scope(url, "census")


def _open(service: Service, key: Ed25519PrivateKey, analysis: FrequencyTable) -> Any:
    sealed = seal(
        [to_body(analysis)], key, researcher="ada", project="p1", dataset="census", server="kept"
    )
    with EmbeddedServer(create_app(service)) as srv, connect(srv.url, key, "ada") as session:
        return session.open(sealed)


def _pointer_reads(service: Service) -> tuple[list[str], Any]:
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "qss_states" in statement:
            reads.append(statement)

    event.listen(service.store.engine, "before_cursor_execute", count)
    return reads, count


def test_an_admission_after_this_process_recorded_reads_no_pointer(tmp_path: Path) -> None:
    root, _url, key, scope = _centre(tmp_path)
    with Service(root) as service:
        assert _open(service, key, TABLES[0]).released  # the scope's first pointer
        reads, count = _pointer_reads(service)
        try:
            for analysis in TABLES[1:]:
                assert _open(service, key, analysis).released
        finally:
            event.remove(service.store.engine, "before_cursor_execute", count)
        assert reads == []
        # what it kept is what is stored
        stored = service.store.qss_pointer(scope)
        assert stored is not None and stored.admitted == len(TABLES)
        assert service.flow.auditor.pointer(scope) == stored


def test_a_pointer_moved_by_another_process_is_read_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, _url, key, scope = _centre(tmp_path)
    with Service(root) as first, Service(root) as second:
        assert _open(first, key, TABLES[0]).released
        kept = first.flow.auditor.pointer(scope)
        assert _open(second, key, TABLES[1]).released  # moves the stored pointer on
        assert first.flow.auditor.pointer(scope) == kept  # stale in `first` now
        # `first` admits against its stale pointer, its guarded UPDATE matches nothing, and it
        # admits again against the stored state: the step is released and counted once
        with caplog.at_level(logging.WARNING, logger="safeaccess.server"):
            result = _open(first, key, TABLES[2])
        assert result.released, result.describe()
        assert "admitting again" in caplog.text
        stored = first.store.qss_pointer(scope)
        assert stored is not None and stored.admitted == 3
        assert first.flow.auditor.pointer(scope) == stored
