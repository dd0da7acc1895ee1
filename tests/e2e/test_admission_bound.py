"""Issue 41 §1 through the real server and client: no step holds the auditor, or the centre.

A filter whose size is the cost is refused at plan time and again by the server; a history that
drives the certificate's exact search deep is decided within the search's budget (refused for
cost, never released); a colleague's step in the same scope is not held while one researcher's
admission runs (the decision is made without the scope's lock); SIGTERM during an admission
stops `serve` within seconds and the step left running is run again at the next start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Dataset, free_port, make_centre, serve_in_subprocess, serving

from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.grammar.limits import MAX_FILTER_VALUES
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.client.validation import AnalysisInvalid
from safeaccess.server.config import DataDir, QssSettings
from safeaccess.server.qss import admission as admission_module
from safeaccess.server.store import Store

#: Records per level of `a` and of `b`, and levels of each. Every cell of the two one-way
#: tables holds 12 records, but the 240 cross cells (the atoms) hold one or two each: the
#: smallest determined combination is one table cell (12 records, so the truth is "release"),
#: yet no packing of disjoint completing sets proves it (a 12-regular bipartite graph has at
#: most 6 disjoint spanning trees), so the certificate's exact search runs until its budget
#: (`tests/rules/test_qss_bound.py` drives the same shape, larger, into the operation count).
PER, LEVELS = 12, 20
LABELS = [f"L{i:03d}" for i in range(150)]


@dataclass
class Site:
    root: Path
    keys: dict[str, Ed25519PrivateKey]
    server_id: str

    def seal(
        self, analyses: list[FrequencyTable], researcher: str = "ada", dataset: str = "plain"
    ) -> Any:
        return seal(
            [to_body(a) for a in analyses],
            self.keys[researcher],
            researcher=researcher,
            project="p1",
            dataset=dataset,
            server=self.server_id,
        )


def _grid() -> tuple[pd.DataFrame, DatasetMetadata]:
    n = PER * LEVELS
    rng = np.random.default_rng(41)
    frame = pd.DataFrame(
        {
            "person_id": np.arange(1, n + 1, dtype=np.int64),
            "a": np.asarray(LABELS)[np.arange(n) // PER],
            "b": np.asarray(LABELS)[rng.permutation(n) // PER],  # independent of `a`
        }
    )
    columns = [Column(name="person_id", type="identifier")]
    levels = LABELS[:LEVELS]
    columns += [Column(name=c, type="categorical", levels=levels) for c in ("a", "b")]
    return frame, DatasetMetadata(name="grid", record_key="person_id", columns=columns)


def _plain() -> tuple[pd.DataFrame, DatasetMetadata]:
    """Two independent binary columns over 400 records (every atom is large), and a column of
    150 levels for the long `in` lists."""
    n = 400
    rng = np.random.default_rng(42)
    frame = pd.DataFrame(
        {
            "person_id": np.arange(1, n + 1, dtype=np.int64),
            "c": rng.choice(["x", "y"], n),
            "d": rng.choice(["u", "v"], n),
            "b": np.asarray(LABELS)[np.arange(n) % len(LABELS)],
        }
    )
    columns = [
        Column(name="person_id", type="identifier"),
        Column(name="c", type="categorical", levels=["x", "y"]),
        Column(name="d", type="categorical", levels=["u", "v"]),
        Column(name="b", type="categorical", levels=LABELS),
    ]
    return frame, DatasetMetadata(name="plain", record_key="person_id", columns=columns)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("bound") / "data"
    keys = {name: Ed25519PrivateKey.generate() for name in ("ada", "bob")}
    project_scope = {"qss": QssSettings(scope="project")}
    datasets = {
        name: Dataset(frame, metadata, options=project_scope)
        for name, (frame, metadata) in (("grid", _grid()), ("plain", _plain()))
    }
    config = make_centre(root, "bound-centre", keys, datasets)
    return Site(root=root, keys=keys, server_id=config.server_id)


@pytest.fixture(scope="module")
def url(site: Site) -> Iterator[str]:
    with serving(site.root) as (_, srv):
        yield srv.url


def _long_in(n: int) -> str:
    return "b in (" + ", ".join(f"'{LABELS[i]}'" for i in range(n)) + ")"


def test_a_long_in_list_is_refused_at_plan_time_and_by_the_server(site: Site, url: str) -> None:
    too_long = FrequencyTable(rows=["c"], where=_long_in(MAX_FILTER_VALUES + 1))
    with connect(url, site.keys["ada"], "ada") as session:
        plan = session.plan("plain")
        with pytest.raises(AnalysisInvalid, match=f"at most {MAX_FILTER_VALUES}") as info:
            plan.add(too_long)
        assert info.value.problems[0].field == "where"
        assert len(plan) == 0
        plan.add(FrequencyTable(rows=["c"], where=_long_in(MAX_FILTER_VALUES)))  # at the limit
        assert len(plan) == 1
        # A client that skips its own validation: the server refuses the same filter.
        [result] = session.run(site.seal([too_long]))
    assert not result.released
    assert f"at most {MAX_FILTER_VALUES}" in result.describe()


def test_a_history_that_drives_the_search_deep_is_decided_within_its_budget(
    site: Site, url: str
) -> None:
    with connect(url, site.keys["ada"], "ada") as session:
        tables = [FrequencyTable(rows=["a"]), FrequencyTable(rows=["b"])]
        results = session.run(site.seal(tables, dataset="grid"))
    assert results[0].released, results[0].describe()
    assert not results[1].released
    # the researcher sees the uniform withhold; the controller's record names the cost refusal
    store = _store(site.root)
    try:
        step = store.get_step(results[1].sequence_id, 2)
    finally:
        store.close()
    assert step is not None and step.decision is not None
    messages = [f["message"] for f in step.decision["findings"] if f["check"] == "query_set"]
    assert any("refused for cost" in m for m in messages), messages


def test_a_colleagues_step_is_not_held_by_a_long_admission(
    site: Site, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ada's admission is held inside the auditor's decision; Bob's step in the same scope is
    admitted and recorded meanwhile, which it could not be if the decision held the scope's
    lock. Ada's decision is then made again against the state Bob's step left."""
    entered, go = threading.Event(), threading.Event()
    real = admission_module.gate
    calls = 0

    def held(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            entered.set()
            assert go.wait(120), "the test never let the first admission go"
        return real(*args, **kwargs)

    monkeypatch.setattr(admission_module, "gate", held)
    outcome: dict[str, Any] = {}

    def ada() -> None:
        with connect(url, site.keys["ada"], "ada") as session:
            outcome["ada"] = session.run(site.seal([FrequencyTable(rows=["c"])]))

    thread = threading.Thread(target=ada)
    thread.start()
    try:
        assert entered.wait(120), "ada's admission never started"
        with connect(url, site.keys["bob"], "bob") as session:
            [bob] = session.run(site.seal([FrequencyTable(rows=["d"])], "bob"))
        assert not go.is_set()  # bob's step was recorded while ada's decision was held
        assert bob.released, bob.describe()
    finally:
        go.set()
        thread.join(120)
    [ada_result] = outcome["ada"]
    assert ada_result.released, ada_result.describe()
    assert calls >= 3  # ada's held decision, bob's, and ada's again on the moved state


_HOLDING_SERVE = """
import sys, time
from pathlib import Path
from safeaccess.rules.qss.guard import Budget
from safeaccess.server.qss import admission
real = admission.gate
marker = Path(sys.argv[1])

def long_admission(*args, **kwargs):
    # an admission that would run for minutes, checking the guard as the search does
    marker.write_text("admitting")
    budget = Budget(cpu_seconds=3600.0)
    while True:
        budget.check()
        time.sleep(0.01)

admission.gate = long_admission
from safeaccess.server.admin.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_sigterm_during_an_admission_stops_serve_and_the_step_is_run_at_the_next_start(
    site: Site, tmp_path: Path
) -> None:
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"
    marker = tmp_path / "admitting"
    script = tmp_path / "holding_serve.py"
    script.write_text(_HOLDING_SERVE)
    args = ["serve", "--data-dir", str(site.root), "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, str(script), str(marker), *args],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("wb"),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    sealed = site.seal([FrequencyTable(rows=["c"])])
    try:
        deadline = time.monotonic() + 180
        while True:  # the server answers once it is up
            try:
                if httpx.get(f"{server_url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "serve did not start"
            time.sleep(0.2)
        session = connect(server_url, site.keys["ada"], "ada", retries=0)
        sender = threading.Thread(target=lambda: _swallow(lambda: session.run(sealed)))
        sender.start()
        while not marker.exists():
            assert time.monotonic() < deadline, "the admission never started"
            time.sleep(0.05)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - stopped < 15
        sender.join(60)
        session.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sequence_id = _running_step(site.root)
    # the next start runs the step left running, without the client sending it again
    proc = serve_in_subprocess(site.root, port)
    try:
        deadline = time.monotonic() + 120
        while _state(site.root, sequence_id) == "running":
            assert time.monotonic() < deadline, "the step left running was never run again"
            time.sleep(0.2)
        assert _state(site.root, sequence_id) == "released"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _swallow(call: Any) -> None:
    # the server goes away mid-step: what the test is about
    with contextlib.suppress(Exception):
        call()


def _store(root: Path) -> Store:
    data = DataDir(root)
    return Store(data.database_url(data.load_config()))


def _running_step(root: Path) -> str:
    store = _store(root)
    try:
        running = [
            s.id
            for s in store.list_sequences("ada")
            if (step := store.get_step(s.id, 1)) is not None and step.state == "running"
        ]
    finally:
        store.close()
    assert len(running) == 1, running
    return running[0]


def _state(root: Path, sequence_id: str) -> str | None:
    store = _store(root)
    try:
        step = store.get_step(sequence_id, 1)
        return None if step is None else str(step.state)
    finally:
        store.close()
