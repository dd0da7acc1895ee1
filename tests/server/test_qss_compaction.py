"""Full state files written in the background after each recorded delta (`StateFiles.compact`,
`qss/compaction.py`): what a load reads, what survives a crash at any point, what pruning keeps."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from replica_helpers import one_researcher_centre, researcher_scope
from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.protocol import seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.rules.qss import AuditPolicy, admit
from safeaccess.rules.qss.encoding import atom_type
from safeaccess.server.config import initialise, scope_folder
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.outcome import QssPointer
from safeaccess.server.qss.compaction import Compactor
from safeaccess.server.qss.gate import (
    COMPACT_DEPTH,
    COMPACT_EVERY,
    FULL_EVERY,
    FULL_SUFFIX,
    StateFiles,
)
from safeaccess.server.qss.universe import (
    Population,
    ScopeState,
    admit_populations,
    decode,
    decode_sealed,
    encode,
    encode_file,
    parent_of,
    sealed_name,
)
from safeaccess.server.service import Service
from safeaccess.server.store import Store

POLICY = AuditPolicy(k=5)
SCOPE = "d/project/p"
N = 50_000  # a delta that splits nothing (a few KB of constraints) is well below N bytes


class Held(Compactor):
    """A compactor whose jobs wait until `run_all` (a full write that has not happened yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[Callable[[], None]] = []

    def submit(self, key: object, job: Callable[[], None]) -> None:
        self.jobs.append(job)

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()


def _step(files: StateFiles, pointer: QssPointer | None, step: int, seed: int = 0) -> str:
    """One admission of a table (int8 cells) loaded from `pointer`, as the server does: the
    state file's digest (not yet compacted)."""
    rng = np.random.default_rng(seed)
    region, sex = rng.integers(0, 10, N), rng.integers(0, 2, N)
    cells = [region, sex, region * 2 + sex][step % 3].astype(np.int8)
    loaded = files.load(SCOPE, pointer, N)
    prepared, _ = admit_populations(loaded, [Population.of(1, np.arange(N))], POLICY)
    admission = admit(prepared.state, [cells], POLICY)
    assert admission.admitted and admission.state is not None
    return files.save(SCOPE, prepared.refined(admission.state, [cells]))


def _chain(files: StateFiles, steps: int, compact: bool = True) -> list[str]:
    """`steps` admissions, each recorded and then compacted (as `Admission.release` does)."""
    pointer: QssPointer | None = None
    digests = []
    for step in range(steps):
        digest = _step(files, pointer, step)
        if compact:
            files.compact(SCOPE, digest)
            files._compactor.wait(30)
        pointer = QssPointer(digest, N, 1)
        digests.append(digest)
    return digests


def _folder(root: Path) -> Path:
    return root / "qss" / scope_folder(SCOPE)


def _fulls(root: Path, digest: str) -> list[Path]:
    return sorted(_folder(root).glob(f"{digest}.*{FULL_SUFFIX}"))


def _state_bytes(files: StateFiles, digest: str) -> bytes:
    return files.load(SCOPE, QssPointer(digest, N, 1), N).state.to_bytes()


class Reads(StateFiles):
    """StateFiles that records which state files (deltas) and full files it opens."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.deltas: list[str] = []
        self.fulls: list[str] = []

    def _read_full(self, scope: str, digest: str) -> ScopeState | None:
        found = super()._read_full(scope, digest)
        if found is not None:
            self.fulls.append(digest)
        return found

    def _path(self, scope: str, digest: str) -> Path:
        self.deltas.append(digest)
        return super()._path(scope, digest)


def test_every_step_writes_a_delta_and_its_full_state_follows_in_the_background(
    tmp_path: Path,
) -> None:
    files = StateFiles(tmp_path, compactor=Compactor())
    digests = _chain(files, 2 * FULL_EVERY + 1)
    raws = [(_folder(tmp_path) / f"{d}.state").read_bytes() for d in digests]
    # no step wrote a full state on its path: each file is a delta of the one before
    assert all(parent_of(raw) == prev for raw, prev in zip(raws[1:], digests, strict=False))
    assert all(len(raw) < 4 * N for raw in raws)  # no int32 atom array in any
    # The first delta holds two int8 arrays (the population's and the table's): COMPACT_EVERY
    # (2) times the state's int8 atom array, so it is compacted at once. The second splits the
    # atoms again (one array); the later steps repeat those cells and split nothing, so their
    # deltas hold no per-record array and the state is compacted every COMPACT_DEPTH deltas.
    assert COMPACT_EVERY == 2 and len(raws[0]) > 2 * N and len(raws[1]) > N
    assert all(len(raw) < N // 2 for raw in raws[2:])
    compacted, deltas, held = [], 0, 0
    for i, raw in enumerate(raws):  # the rule, from the files' sizes
        deltas, held = deltas + 1, held + len(raw)
        if deltas >= COMPACT_DEPTH or held >= COMPACT_EVERY * N:
            compacted, deltas, held = [*compacted, i], 0, 0
    assert compacted == [0, COMPACT_DEPTH, 2 * COMPACT_DEPTH]
    for i, digest in enumerate(digests):
        if i not in compacted:
            assert _fulls(tmp_path, digest) == []
            continue
        (full,) = _fulls(tmp_path, digest)
        raw = full.read_bytes()
        warm = files.load(SCOPE, QssPointer(digest, N, 1), N)
        parts = encode_file(replace(warm, base=None, depth=0, steps=()), delta=False)
        assert raw == b"".join(parts)  # the full state, named by its head and checksum
        assert full.name == f"{digest}.{sealed_name(parts[0], parts[-1])}{FULL_SUFFIX}"
        atoms = N * atom_type(warm.state.n_atoms).itemsize
        assert parent_of(raw) is None and len(raw) > atoms  # with its per-record atom array
        assert decode_sealed(raw, full.name.split(".")[1]).state.to_bytes() == _state_bytes(
            files, digest
        )


def test_a_cold_load_reads_the_full_file_and_no_delta(tmp_path: Path) -> None:
    files = StateFiles(tmp_path, compactor=Compactor())
    digests = _chain(files, 1 + COMPACT_DEPTH)  # the second full file, COMPACT_DEPTH on
    cold = Reads(tmp_path)
    loaded = cold.load(SCOPE, QssPointer(digests[-1], N, 1), N)
    assert cold.fulls == [digests[-1]] and cold.deltas == []
    assert loaded.state.to_bytes() == _state_bytes(files, digests[-1])
    assert loaded.depth == 0  # the next step's delta starts a new chain


def test_a_crash_between_the_delta_and_its_full_write_loads_the_parent_full_and_the_delta(
    tmp_path: Path,
) -> None:
    files = StateFiles(tmp_path, compactor=Compactor())
    digests = _chain(files, 1)  # with its full file
    last = _step(files, QssPointer(digests[-1], N, 1), 4)  # recorded; the process died then
    assert _fulls(tmp_path, last) == []
    cold = Reads(tmp_path)
    loaded = cold.load(SCOPE, QssPointer(last, N, 1), N)
    assert cold.fulls == [digests[-1]] and last in cold.deltas
    assert loaded.state.to_bytes() == _state_bytes(files, last)
    assert loaded.depth == 1
    # the next step (another process) writes a delta of it and a full file after it
    after = StateFiles(tmp_path, compactor=Compactor())
    digest = _step(after, QssPointer(last, N, 1), 5)
    assert parent_of((_folder(tmp_path) / f"{digest}.state").read_bytes()) == last
    after.compact(SCOPE, digest)
    after._compactor.wait(30)
    assert len(_fulls(tmp_path, digest)) == 1


def test_a_half_written_or_damaged_full_file_is_never_read(tmp_path: Path) -> None:
    files = StateFiles(tmp_path, compactor=Held())
    digests = _chain(files, 3, compact=False)
    expected = _state_bytes(files, digests[-1])
    folder = _folder(tmp_path)
    # a writer killed mid-write leaves its temporary file: never a name a reader opens
    full_bytes = encode(files.load(SCOPE, QssPointer(digests[-1], N, 1), N))
    tmp = folder / f".{digests[-1]}.{'0' * 64}{FULL_SUFFIX}.1.2.tmp"
    tmp.write_bytes(full_bytes[: len(full_bytes) // 2])
    cold = Reads(tmp_path)
    assert cold.load(SCOPE, QssPointer(digests[-1], N, 1), N).state.to_bytes() == expected
    assert cold.fulls == []
    # a full file whose bytes do not match its name (damaged on disk) is ignored: the deltas
    # give the state. In its head (a change that still decodes: a population's decision) or in
    # its per-record atoms (the state's own checksum no longer matches)
    parts = encode_file(
        replace(files.load(SCOPE, QssPointer(digests[-1], N, 1), N), base=None, steps=()),
        delta=False,
    )
    assert b"".join(parts) == full_bytes
    name = folder / f"{digests[-1]}.{sealed_name(parts[0], parts[-1])}{FULL_SUFFIX}"
    head = full_bytes.replace(b'"admitted"', b'"refused" ', 1)
    assert head != full_bytes and decode(head).populations == {1: "refused"}
    # two records of different atoms swapped: every count still checks, only the checksum not
    stored = atom_type(files.load(SCOPE, QssPointer(digests[-1], N, 1), N).state.n_atoms)
    w = stored.itemsize
    at = next(k for k, part in enumerate(parts) if len(part) == w * N)
    start = sum(len(part) for part in parts[:at])
    atom_of = np.frombuffer(parts[at], dtype=stored)
    i, j = 0, int(np.flatnonzero(atom_of != atom_of[0])[0])
    atoms = bytearray(full_bytes)
    atoms[start + w * i : start + w * i + w] = atom_of[j].tobytes()
    atoms[start + w * j : start + w * j + w] = atom_of[i].tobytes()
    for damaged in (head, bytes(atoms)):
        name.write_bytes(damaged)
        cold = Reads(tmp_path)
        assert cold.load(SCOPE, QssPointer(digests[-1], N, 1), N).state.to_bytes() == expected
        assert cold.fulls == [] and digests[0] in cold.deltas
    name.write_bytes(full_bytes)  # the control: the same file undamaged is read
    cold = Reads(tmp_path)
    assert cold.load(SCOPE, QssPointer(digests[-1], N, 1), N).state.to_bytes() == expected
    assert cold.fulls == [digests[-1]]


def test_without_background_writes_the_chain_stays_bounded(tmp_path: Path) -> None:
    held = Held()
    files = StateFiles(tmp_path, compactor=held)
    digests = _chain(files, FULL_EVERY + 1)  # compact() queues jobs that never run
    parents = [parent_of((_folder(tmp_path) / f"{d}.state").read_bytes()) for d in digests]
    assert parents.index(None) == FULL_EVERY - 1  # written full on the path, as a bound
    assert held.jobs and all(not _fulls(tmp_path, d) for d in digests)
    cold = StateFiles(tmp_path).load(SCOPE, QssPointer(digests[-1], N, 1), N)
    assert cold.state.to_bytes() == _state_bytes(files, digests[-1])


def test_a_newer_state_replaces_a_queued_full_write_of_its_scope(tmp_path: Path) -> None:
    compactor = Compactor()
    started, go = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        started.set()
        go.wait(10)

    compactor.submit("other", blocker)  # the worker is busy
    assert started.wait(10)
    for name in ("first", "second", "third"):
        compactor.submit(SCOPE, lambda name=name: ran.append(name))  # type: ignore[misc]
    go.set()
    assert compactor.wait(10)
    assert ran == ["third"]


def test_full_writes_are_queued_by_the_cadence_while_the_earlier_are_running(
    tmp_path: Path,
) -> None:
    # Steps admitted while a full write runs in the background (the busy server's case): the
    # cadence counts from the write queued, not at every step until the first completes. Step
    # 1's delta holds two int8 arrays (the population's, sex): queued at once. Step 2 splits
    # the atoms again (region within sex), the later ones split nothing: the next is queued
    # COMPACT_DEPTH deltas after the first, not at each step while the first waits.
    held = Held()
    files = StateFiles(tmp_path, compactor=held)
    pointer: QssPointer | None = None
    digests, queued_at = [], []
    for step in range(1, FULL_EVERY):
        digests.append(_step(files, pointer, step))
        before = len(held.jobs)
        files.compact(SCOPE, digests[-1])
        if len(held.jobs) > before:
            queued_at.append(step)
        pointer = QssPointer(digests[-1], N, 1)
    assert COMPACT_DEPTH == FULL_EVERY - 2 and queued_at == [1, 1 + COMPACT_DEPTH]
    assert all(parent_of((_folder(tmp_path) / f"{d}.state").read_bytes()) for d in digests[1:])
    held.run_all()  # the queued writes complete: a cold load reads the newest full file
    cold = Reads(tmp_path)
    assert pointer is not None
    loaded = cold.load(SCOPE, pointer, N)
    newest_full = digests[queued_at[-1] - 1]
    assert cold.fulls == [newest_full]
    assert newest_full not in cold.deltas and set(cold.deltas) <= set(digests[queued_at[-1] :])
    assert loaded.state.to_bytes() == _state_bytes(files, pointer.digest)


def test_pruning_keeps_what_the_current_state_needs_and_drops_what_a_full_file_replaced(
    tmp_path: Path,
) -> None:
    files = StateFiles(tmp_path, compactor=Compactor())
    digests = _chain(files, 1 + COMPACT_DEPTH)  # full files after the first and the last step
    folder = _folder(tmp_path)
    fulls = {p.name.split(".", 1)[0] for p in folder.glob(f"*{FULL_SUFFIX}")}
    assert fulls == {digests[0], digests[-1]}
    # the step's base (its record failed) needs its chain back to the first step's full file
    files.prune(SCOPE, digests[-1], digests[-2])
    states = {p.stem for p in folder.glob("*.state")}
    assert states == set(digests)
    # once recorded, only the newest three stay; the older ones have a full file after
    files.prune(SCOPE, digests[-1])
    states = {p.stem for p in folder.glob("*.state")}
    assert states == set(digests[-3:])
    fulls = {p.name.split(".", 1)[0] for p in folder.glob(f"*{FULL_SUFFIX}")}
    assert fulls == {digests[-1]}  # a full file goes with its state file
    cold = StateFiles(tmp_path).load(SCOPE, QssPointer(digests[-1], N, 1), N)
    assert cold.state.to_bytes() == _state_bytes(files, digests[-1])
    # a crash before the newest delta's full write: its parent chain is needed and kept
    last = _step(files, QssPointer(digests[-1], N, 1), 8)
    more = [_step(files, QssPointer(last, N, 1), 9)]
    more.append(_step(files, QssPointer(more[-1], N, 1), 10))
    more.append(_step(files, QssPointer(more[-1], N, 1), 11))
    files.prune(SCOPE, more[-1])
    states = {p.stem for p in folder.glob("*.state")}
    assert {digests[-1], last, *more} <= states  # back to the newest full file
    assert _fulls(tmp_path, digests[-1])
    cold = StateFiles(tmp_path).load(SCOPE, QssPointer(more[-1], N, 1), N)
    assert cold.state.to_bytes() == _state_bytes(files, more[-1])


def test_a_parent_pruned_during_a_cold_load_is_read_again_from_the_new_full_file(
    tmp_path: Path,
) -> None:
    files = StateFiles(tmp_path, compactor=Held())
    digests = _chain(files, 3, compact=False)
    expected = _state_bytes(files, digests[-1])

    class Late(StateFiles):
        """Looks for the full file just before another process writes it and prunes."""

        looked = False

        def _read_full(self, scope: str, digest: str) -> ScopeState | None:
            if not Late.looked:
                Late.looked = True
                found = super()._read_full(scope, digest)
                files.write_full(SCOPE, digests[-1], files.load(SCOPE, pointer, N))
                files.prune(SCOPE, digests[-1])  # the parents are no longer needed: gone
                (_folder(tmp_path) / f"{digests[0]}.state").unlink(missing_ok=True)
                return found
            return super()._read_full(scope, digest)

    pointer = QssPointer(digests[-1], N, 1)
    assert Late(tmp_path).load(SCOPE, pointer, N).state.to_bytes() == expected


def test_the_worker_survives_a_failing_write() -> None:
    compactor = Compactor()
    done: list[int] = []

    def fail() -> None:
        raise OSError("disk full")

    compactor.submit("a", fail)
    compactor.submit("b", lambda: done.append(1))
    assert compactor.wait(10) and done == [1]


def test_closing_a_service_waits_for_its_background_writes(tmp_path: Path) -> None:
    root = tmp_path / "data"
    initialise(root, server_id="closing")
    service = Service(root)
    compactor = Compactor()
    service.flow.auditor.files._compactor = compactor
    written: list[bool] = []

    def slow_write() -> None:
        time.sleep(0.5)
        written.append(True)

    compactor.submit("scope", slow_write)
    service.close()
    # Its data directory may be removed now: nothing writes into it any more.
    assert written == [True]


# -- two services (replicas) on one PostgreSQL database and one data directory ------------------


@pytest.mark.slow
def test_two_replicas_admitting_in_one_scope_leave_a_state_every_process_loads(
    postgres_database: str, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    key = Ed25519PrivateKey.generate()
    one_researcher_centre(
        root,
        postgres_database,
        key,
        server_id="pair",
        dataset="census",
        frame=generate_census(2000, seed=3),
        metadata=census_metadata("census"),
    )
    scope = researcher_scope(postgres_database, "census")
    tables = [
        FrequencyTable(rows=["region"], cols=["sex"]),
        FrequencyTable(rows=["region"]),
        FrequencyTable(rows=["sex"]),
        FrequencyTable(rows=["sex"], cols=["region"]),
    ]
    with contextlib.ExitStack() as stack:
        services = [stack.enter_context(Service(root)) for _ in range(2)]
        # as separate processes, each replica has its own background writer
        compactors = [Compactor(), Compactor()]
        for service, compactor in zip(services, compactors, strict=True):
            service.flow.auditor.files._compactor = compactor
        urls = [stack.enter_context(EmbeddedServer(create_app(s))).url for s in services]
        results: list[StepResult] = []
        errors: list[BaseException] = []

        def run(replica: int, analysis: FrequencyTable) -> None:
            sealed = seal(
                [to_body(analysis)],
                key,
                researcher="ada",
                project="p1",
                dataset="census",
                server="pair",
            )
            try:
                with connect(urls[replica], key, "ada") as session:
                    results.append(session.open(sealed))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(i % 2, tables[i % len(tables)])) for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not errors, errors
        assert len(results) == 8 and all(r.released for r in results)
        assert all(c.wait(60) for c in compactors)
        store = Store(postgres_database)
        try:
            pointer = store.qss_pointer(scope)
        finally:
            store.close()
        assert pointer is not None and pointer.admitted == 8  # each admitted once
        folder = root / "qss" / scope_folder(scope)
        # every full file on disk is whole and named by its bytes; no temporary file is left
        fulls = sorted(folder.glob(f"*{FULL_SUFFIX}"))
        assert fulls and not list(folder.glob(".*.tmp"))
        for full in fulls:
            assert decode_sealed(full.read_bytes(), full.name.split(".")[1]).state.n_records
        # a new process loads the pointer's state from a full file and a short chain
        cold = Reads(root)
        loaded = cold.load(scope, pointer, pointer.n_records)
        assert len(cold.fulls) == 1 and len(set(cold.deltas)) < FULL_EVERY
        warm = services[0].flow.auditor.files.load(scope, pointer, pointer.n_records)
        assert loaded.state.to_bytes() == warm.state.to_bytes()
        assert loaded.state.n_query_sets == warm.state.n_query_sets
