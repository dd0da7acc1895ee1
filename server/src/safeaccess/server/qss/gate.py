"""Admitting a checked output into its scope's query-set auditor state.

After the rules check says release or review, the output's per-record query set (over the row
positions of the dataset version that ran) is mapped to stable record ids, cells a mitigation
suppressed are dropped (their values never leave), and `safeaccess.rules.qss.admit` either admits
it, giving the scope's next state, or refuses: the step is then withheld with the auditor's reason
and the state stays as it was. Review steps count as admitted (a checker may release them later
without seeing what was released meanwhile). Script outputs carry no query set; they go to a
person anyway.

States are content-addressed files `qss/<scope folder>/<sha256>.state` under the data directory
(the auditor's state in the envelope of `qss_universe`, which records the dataset versions whose
populations the scope has admitted before any output), written before the step's transaction; the database row `qss_states` points at the current one and
moves in the step's transaction (`Store.settle_step(qss=...)`). A crash in between leaves an
unreferenced file, the old pointer and a re-runnable step. The last few files of a scope are kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.decision import Decision, Finding, combine
from safeaccess.rules.outputs import (
    Output,
    QuerySet,
    ScriptOutput,
    TableOutput,
    extra_query_sets_of,
    query_set_of,
)
from safeaccess.rules.qss import (
    Admission,
    AuditMode,
    AuditPolicy,
    AuditState,
    QuerySetError,
    StateFormatError,
    WeightedSet,
    admit,
)
from safeaccess.rules.qss.encoding import atom_type
from safeaccess.server.config import QssSettings, scope_folder
from safeaccess.server.outcome import QssCommit, QssPointer
from safeaccess.server.qss.compaction import COMPACTOR, Compactor
from safeaccess.server.qss.grid import Origin, data_revealed, origin_of, output_labels
from safeaccess.server.qss.universe import (
    EMPTY,
    ScopeState,
    decode,
    decode_chain,
    decode_sealed,
    empty_base,
    empty_scope,
    encode_file,
    parent_of,
    sealed_name,
)

CHECK = "query_set"
KEEP_FILES = 3


class AuditUnavailable(Exception):
    """The output reached the server without a usable query set: it cannot be audited, so it is
    not released (a centre failure: the step stays re-runnable)."""


def policy_for(settings: QssSettings, threshold: int) -> AuditPolicy:
    mode = AuditMode.SPAN if settings.mode == "span" else AuditMode.ATOMS
    return AuditPolicy(mode=mode, k=threshold, atom_cap=settings.atom_cap)


#: At most this many deltas separate a state file from a full one on disk: a step whose base
#: is `FULL_EVERY - 1` deltas from a full state writes a full one itself. Full states are
#: written in the background after each recorded step (`compact`), so a step only gets here
#: when those writes have not completed (a crash, a failing disk); the bound keeps a cold
#: load's chain short whatever happens.
FULL_EVERY = 8
#: A delta has its full state written in the background once its step is recorded when the
#: deltas since a full file, or since a state queued for a full write, hold `COMPACT_EVERY`
#: times the full state's atom array in bytes (`encoding.atom_type`), or number
#: `COMPACT_DEPTH`. A cold load then reads one full file and about `COMPACT_EVERY` atom arrays'
#: worth of deltas (more should the newest full writes not have completed). A step whose query
#: sets split no atom (another statistic on cells released before, a repeated table) writes a
#: delta without a per-record array, a few KB: re-writing the unchanged atoms every second such
#: step spared a cold load almost nothing, so those are compacted every `COMPACT_DEPTH` steps.
#: The cadence counts from the write queued, also while steps are admitted faster than the
#: writes run.
COMPACT_EVERY = 2
#: Deltas since a full file (or a queued full write) after which the state is compacted
#: whatever their bytes: below `FULL_EVERY - 1`, so that the background write, not the step's
#: own path, is what keeps the chain bounded.
COMPACT_DEPTH = FULL_EVERY - 2
#: Temporary files older than this are left-overs of a killed writer, removed when pruning (a
#: live write takes well under a second).
STALE_TMP_SECONDS = 3600.0
#: A full state written in the background for the state file `<digest>.state`:
#: `<digest>.<sha256 of this file>.full`.
FULL_SUFFIX = ".full"

log = logging.getLogger("safeaccess.server")


class StateFiles:
    """The scopes' auditor states on disk, with the most recent few kept decoded in memory.

    An admitted step writes a delta of the state file it was admitted from
    (`universe.encode_file`; a scope's first, of the empty state): its query-set arrays and the
    small rest, not the per-record atom array, so it writes about n_records bytes for a table of
    up to 127 cells (10 MB at 10 M records), and hashes it once.
    Once a step is recorded whose deltas since a full file (or since a state queued for a full
    write) hold `COMPACT_EVERY` atom arrays' worth of bytes, or number `COMPACT_DEPTH`,
    `compact` writes its state in full in the background, as `<digest>.<name>.full` beside the
    delta `<digest>.state` (`universe.sealed_name`; temporary file, fsync, rename: a reader
    never sees a partial one). A load walks back from the pointer's file and stops at the first
    state it has decoded in memory or that has a full file: a cold load reads one full file and
    deltas of less than `COMPACT_EVERY` atom arrays in all, or fewer than `COMPACT_DEPTH` small
    ones (more only when background writes did not complete). A step whose base is
    `FULL_EVERY - 1` deltas from a full file writes a full state itself."""

    def __init__(self, root: Path, cache_size: int = 4, compactor: Compactor = COMPACTOR):
        self.root = root / "qss"
        self._cache: OrderedDict[str, ScopeState] = OrderedDict()
        self._cache_size = cache_size
        self._guard = threading.Lock()
        self._parents: dict[str, str | None] = {}  # digest -> the digest it is a delta of
        #: per scope, the newest delta written and its state, until `compact` takes it
        self._unfull: dict[str, tuple[str, ScopeState]] = {}
        #: digest -> (deltas, their bytes) since a state of its chain was queued for a full
        #: write (or was full): the compaction cadence counts from the write queued, not from
        #: the one completed, else every step admitted while a full write runs queues another
        self._since_queued: dict[str, tuple[int, int]] = {}
        self._compactor = compactor

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the full states being written in the background; False after `timeout`."""
        return self._compactor.wait(timeout)

    def _path(self, scope: str, digest: str) -> Path:
        return self.root / scope_folder(scope) / f"{digest}.state"

    def _fulls(self, scope: str, digest: str) -> list[Path]:
        """The full files written for state file `digest` (normally none or one): the names
        `<digest>.<name>.full`. One listing with plain name tests; `Path.glob` compiled a new
        pattern for each digest, a quarter of a background full write's CPU at 100 000 records."""
        folder = self.root / scope_folder(scope)
        prefix = f"{digest}."
        try:
            with os.scandir(folder) as listing:
                names = [
                    entry.name
                    for entry in listing
                    if entry.name.startswith(prefix)
                    and entry.name.endswith(FULL_SUFFIX)
                    and len(entry.name) > len(prefix) + len(FULL_SUFFIX)
                ]
        except FileNotFoundError:
            return []
        return [folder / name for name in sorted(names)]

    def load(self, scope: str, pointer: QssPointer | None, n_records: int) -> ScopeState:
        """The scope's current state, grown to at least `n_records` record ids."""
        if pointer is None:
            return empty_scope(n_records)
        try:
            loaded = self._decoded(scope, pointer.digest)
        except _Vanished:
            # a file of the chain was pruned while we walked it, after another process wrote
            # a full file that makes it unneeded: walk again, which finds that full file
            try:
                loaded = self._decoded(scope, pointer.digest)
            except _Vanished as exc:
                raise AuditUnavailable(f"the audit state of scope {scope!r} is missing") from exc
        since = loaded.state.n_query_sets
        return replace(loaded, base=pointer.digest, steps=(), since=since).grown(n_records)

    def _read_full(self, scope: str, digest: str) -> ScopeState | None:
        """The state of file `digest` from its full file, or None when there is none (or none
        that checks against its name: it is ignored, and the deltas are read instead)."""
        for path in self._fulls(scope, digest):
            expected = path.name[len(digest) + 1 : -len(FULL_SUFFIX)]
            try:
                return decode_sealed(path.read_bytes(), expected)
            except FileNotFoundError:
                continue  # pruned meanwhile
            except StateFormatError as exc:
                log.warning("scope %s: ignoring the full state file %s: %s", scope, path.name, exc)
        return None

    def _decoded(self, scope: str, digest: str) -> ScopeState:
        """The state in file `digest`: from the cache, else from its full file, else read with
        the files it is a delta of (back to a cached state or one with a full file, each checked
        against its digest) and replayed in one pass (`universe.decode_chain`). Only the state
        asked for is kept in the cache: the parents of a cold load would push out live scopes."""
        chain: list[bytes] = []  # from `digest` back towards a full state
        base: ScopeState | None = None
        current: str | None = digest
        while current is not None:
            if current == EMPTY:  # a scope's first file: a delta of the empty state
                base = empty_base()
                break
            with self._guard:
                base = self._cache.get(current)
            if base is not None:
                break
            base = self._read_full(scope, current)
            if base is not None:
                break
            if len(chain) > FULL_EVERY:
                raise AuditUnavailable(f"the audit state of scope {scope!r} has too long a chain")
            try:
                raw = self._path(scope, current).read_bytes()
            except FileNotFoundError as exc:
                if chain:  # a parent: maybe pruned after a full file made it unneeded
                    raise _Vanished(current) from exc
                raise AuditUnavailable(f"the audit state of scope {scope!r} is missing") from exc
            if hashlib.sha256(raw).hexdigest() != current:
                raise AuditUnavailable(f"the audit state of scope {scope!r} is corrupt")
            try:
                parent = parent_of(raw)
            except StateFormatError as exc:
                raise AuditUnavailable(f"the audit state of scope {scope!r}: {exc}") from exc
            with self._guard:
                self._parents[current] = parent
            chain.append(raw)
            current = parent
        try:
            if base is None:
                # the full state the chain starts from, checked against its digest above
                base = decode(chain.pop(), verified=True)
            decoded = decode_chain(base, chain[::-1])
        except StateFormatError as exc:
            raise AuditUnavailable(f"the audit state of scope {scope!r}: {exc}") from exc
        # the deltas now between this state and a full one on disk (bounds the next chain)
        decoded = replace(decoded, depth=base.depth + len(chain) if chain else base.depth)
        self._remember(digest, decoded)
        return decoded

    def _remember(self, digest: str, state: ScopeState) -> None:
        with self._guard:
            self._cache[digest] = state
            self._cache.move_to_end(digest)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def save(self, scope: str, state: ScopeState) -> str:
        """Write a state durably (tmp file, fsync, rename): a delta of `state.base` by
        `state.steps`, or a full state when the base is `FULL_EVERY - 1` deltas from a full
        file. Returns its digest (the SHA-256 of the file). Once the step is recorded,
        `compact` writes the full state of a delta in the background when the deltas since a
        full one hold `COMPACT_EVERY` atom arrays' worth of bytes or number `COMPACT_DEPTH`."""
        delta = state.base is not None and state.depth + 1 < FULL_EVERY
        parts = encode_file(state, delta=delta)
        digest = _digest_of(parts)
        _write(self._path(scope, digest), parts, mkdir=True)
        depth = state.depth + 1 if delta else 0
        atoms = state.state.n_records * atom_type(state.state.n_atoms).itemsize
        threshold = COMPACT_EVERY * atoms
        with self._guard:
            self._parents[digest] = state.base if delta else None
            since = (0, 0)
            if delta and state.base is not None:
                # a base this process did not write (a cold load): each delta of its chain
                # counts as a whole threshold, so a delta's next step is compacted, as before
                deltas, written = self._since_queued.get(
                    state.base, (state.depth, state.depth * threshold)
                )
                since = (deltas + 1, written + sum(memoryview(part).nbytes for part in parts))
            self._since_queued[digest] = since
        stored = replace(state, base=None, depth=depth, steps=())
        self._remember(digest, stored)
        if delta and (since[0] >= COMPACT_DEPTH or since[1] >= threshold):
            with self._guard:
                self._unfull.pop(scope, None)
                self._unfull[scope] = (digest, stored)
                # a step whose record failed never calls `compact`: bound what waits for it
                while len(self._unfull) > self._cache_size:
                    self._unfull.pop(next(iter(self._unfull)))
        return digest

    def compact(self, scope: str, digest: str) -> None:
        """Write the full state of the delta `digest` (this scope's newest, just recorded) in
        the background; nothing when `save` found no full write due (`COMPACT_EVERY`,
        `COMPACT_DEPTH`), it was written full, or it is no longer the newest saved."""
        with self._guard:
            found = self._unfull.get(scope)
            if found is None or found[0] != digest:
                return
            del self._unfull[scope]
            self._since_queued[digest] = (0, 0)
        state = found[1]
        self._compactor.submit(
            (str(self.root), scope), lambda: self.write_full(scope, digest, state)
        )

    def write_full(self, scope: str, digest: str, state: ScopeState) -> Path | None:
        """Write `state`, the state of file `digest`, as its full file (what the background
        job does; None when one is there already). A crash leaves at most a temporary file."""
        if not self._path(scope, digest).exists() or self._fulls(scope, digest):
            return None  # pruned already, or written by another process
        parts = encode_file(replace(state, base=None, depth=0, steps=()), delta=False)
        name = sealed_name(parts[0], parts[-1])
        full = self.root / scope_folder(scope) / f"{digest}.{name}{FULL_SUFFIX}"
        _write(full, parts, mkdir=False)
        with self._guard:
            cached = self._cache.get(digest)
            if cached is not None:  # the next delta of this state starts a new chain
                self._cache[digest] = replace(cached, depth=0)
        return full

    def _chain(self, scope: str, digest: str, with_full: set[str] | None = None) -> set[str]:
        """`digest` and every state file it needs: the parents of a delta, back to a full one
        or to one with a full file (`with_full`: the digests that have one, from a listing of
        the folder; None: look for each)."""
        chain: set[str] = set()
        current: str | None = digest
        while current is not None and current != EMPTY and current not in chain:
            if len(chain) > FULL_EVERY:
                break
            chain.add(current)
            has_full = (
                current in with_full if with_full is not None else self._fulls(scope, current)
            )
            if has_full:
                break
            with self._guard:
                known = current in self._parents
                parent = self._parents.get(current)
            if not known:
                try:
                    with self._path(scope, current).open("rb") as fh:
                        parent = parent_of(fh.read(1 << 16))
                except (OSError, StateFormatError):
                    parent = None
                with self._guard:
                    self._parents[current] = parent
            current = parent
        return chain

    def prune(self, scope: str, current: str, base: str | None = None) -> None:
        """Remove all but the newest few state files of a scope, never one that the `current`
        state (or its `base`, when the step's record failed) needs; a full file goes with its
        state file, and left-over temporary files of killed writers go too.

        Everything is decided from one listing of the folder (it runs after every admitted
        step): a file written after it is not in it and stays, and a full file written after
        it only makes the chains kept here longer than needed, until the next prune."""
        folder = self.root / scope_folder(scope)
        states: list[os.DirEntry[str]] = []
        fulls: list[os.DirEntry[str]] = []
        temporary: list[os.DirEntry[str]] = []
        try:
            with os.scandir(folder) as listing:
                for entry in listing:
                    if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                        temporary.append(entry)
                    elif entry.name.endswith(".state"):
                        states.append(entry)
                    elif entry.name.endswith(FULL_SUFFIX):
                        fulls.append(entry)
        except FileNotFoundError:
            return
        with_full = {entry.name.split(".", 1)[0] for entry in fulls}
        keep = self._chain(scope, current, with_full)
        if base is not None:
            keep |= self._chain(scope, base, with_full)
        states.sort(key=_entry_mtime, reverse=True)
        stems = [entry.name[: -len(".state")] for entry in states]
        gone = {stem for stem in stems[KEEP_FILES:] if stem not in keep}
        for stem in gone:
            (folder / f"{stem}.state").unlink(missing_ok=True)
            with self._guard:
                self._parents.pop(stem, None)
                self._since_queued.pop(stem, None)
        left = set(stems) - gone
        for entry in fulls:
            stem = entry.name.split(".", 1)[0]
            # its state file is gone: nothing reads it (one written since the listing, by
            # another admission and its background write, stays)
            if stem not in left and not (folder / f"{stem}.state").exists():
                Path(entry.path).unlink(missing_ok=True)
        now = time.time()
        for entry in temporary:
            if now - _entry_mtime(entry) > STALE_TMP_SECONDS:
                Path(entry.path).unlink(missing_ok=True)


class _Vanished(Exception):
    """A parent state file disappeared while a load walked the chain."""


def _entry_mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _digest_of(parts: list[bytes | memoryview]) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part)
    return hasher.hexdigest()


def _write(target: Path, parts: list[bytes | memoryview], *, mkdir: bool) -> None:
    """Write `parts` durably as `target` (named by its digest, so an existing file is the same
    bytes): a temporary file, fsync, then an atomic rename."""
    if mkdir:
        target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with tmp.open("wb") as fh:
                for part in parts:
                    fh.write(part)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _released_cells(output: Output, n_cells: int) -> np.ndarray | None:
    """Which query-set cells are released: all but the body cells a mitigation suppressed;
    None when every cell is (what was suppressed is shown to the researcher, so choosing the
    path by it depends only on the released output)."""
    if not isinstance(output, TableOutput) or output.suppressed is None:
        return None
    released = np.ones(n_cells, dtype=bool)
    width = len(output.col_labels) - (1 if output.margins and output.col_vars else 0)
    if width <= 0:
        return None
    for i in range(n_cells):
        r, c = divmod(i, width)
        if r < len(output.suppressed) and c < len(output.suppressed[r]):
            released[i] = not output.suppressed[r][c]
    return None if bool(released.all()) else released


class _Layouts:
    """Whether a version's positions -> record ids array is the identity (0, 1, ..., n-1), once
    per array object. A version whose ids are its positions needs no scatter by id: at 10 M
    records that scatter costs 60 ms a step. The answer depends on how the version was
    registered (version 1's ids are always its positions: `record_ids.assign_ids`), so every
    step on a version takes the same path whatever records it selects."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[weakref.ref[np.ndarray], bool]] = {}
        self._guard = threading.Lock()

    def identity(self, ids: np.ndarray) -> bool:
        with self._guard:
            known = self._known.get(id(ids))
        if known is not None and known[0]() is ids:
            return known[1]
        answer = bool(ids.ndim == 1 and np.array_equal(ids, np.arange(len(ids), dtype=ids.dtype)))
        with self._guard:
            self._known = {k: v for k, v in self._known.items() if v[0]() is not None}
            self._known[id(ids)] = (weakref.ref(ids), answer)
        return answer


_LAYOUTS = _Layouts()


def stable_query_set(output: Output, ids: np.ndarray, n_records: int) -> np.ndarray | None:
    """The output's query set over stable record ids (suppressed cells -1), or None for an
    output without one (a script). Raises AuditUnavailable when it should have one and does not."""
    qs = query_set_of(output)
    if qs is None:
        if isinstance(output, ScriptOutput):
            return None
        raise AuditUnavailable(f"a {output.type} output arrived without its query set")
    return _stable(output, qs, ids, n_records)


def extra_stable_query_sets(output: Output, ids: np.ndarray, n_records: int) -> list[np.ndarray]:
    """The further partitions of an output's records (each tree of a forest after the first, a
    fit's dummy columns), over stable record ids; each is admitted with the main query set.
    Weighted sets are not among them (`weighted_stable_sets`)."""
    return [
        _stable(output, qs, ids, n_records) for qs in extra_query_sets_of(output) if not qs.weighted
    ]


def weighted_stable_sets(output: Output, ids: np.ndarray, n_records: int) -> list[WeightedSet]:
    """An output's weighted rows (a fit's few-valued regressors, issue 41) over stable record
    ids: admitted after the partitions, numbered after them (`grid.output_labels`)."""
    return [
        WeightedSet(_stable(output, qs, ids, n_records), np.asarray(qs.weights, np.float64))
        for qs in extra_query_sets_of(output)
        if qs.weighted
    ]


def _stable(output: Output, qs: QuerySet, ids: np.ndarray, n_records: int) -> np.ndarray:
    """The query set over record ids, in its compact cell type (`outputs.cell_dtype`)."""
    if not qs.attached:
        raise AuditUnavailable("the output's query-set array did not arrive")
    positions = qs.to_array()
    if len(positions) != len(ids):
        raise AuditUnavailable(
            f"the query set covers {len(positions)} records, the dataset version has {len(ids)}"
        )
    released = _released_cells(output, len(qs.labels))
    cells = positions
    if released is not None:
        # one gather through a table of the cells: a suppressed cell's index maps to -1, and
        # -1 (outside) indexes the table's last entry, which is -1 too
        table = np.full(len(qs.labels) + 1, -1, dtype=positions.dtype)
        kept = np.flatnonzero(released)
        table[kept] = kept
        cells = table[positions]
    if len(ids) == n_records and _LAYOUTS.identity(ids):
        return cells
    stable = np.full(n_records, -1, dtype=cells.dtype)
    if _LAYOUTS.identity(ids):
        stable[: len(ids)] = cells
    else:
        stable[ids] = cells
    return stable


@dataclass
class Gate:
    """The auditor's verdict on one output, ready to be recorded."""

    decision: Decision
    facts: dict[str, Any] = field(default_factory=dict)
    state: AuditState | None = None  # the scope's next state when admitted
    origin: tuple[int, Origin] | None = None  # what the admitted rows are, by admission number
    #: the query-set arrays (over record ids) the state was refined by, in order, when admitted
    arrays: tuple[np.ndarray, ...] = ()


def _json_facts(admission: Admission) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (admission.facts or {}).items():
        if isinstance(value, np.generic):
            value = value.item()
        out[str(key)] = value
    return out


def gate(
    output: Output,
    decision: Decision,
    *,
    ids: np.ndarray,
    state: AuditState,
    policy: AuditPolicy,
    scope: str,
    analysis: dict[str, Any] | None = None,
    metadata: DatasetMetadata | None = None,
    origins: Mapping[int, Origin] | None = None,
) -> Gate:
    """Admit `output` (already checked: `decision`) against `state`, or withhold it.

    With `analysis` and `metadata` (the step's analysis and its dataset's metadata) and the
    scope's `origins`, an admission whose new query sets the records alone make combinations of
    released ones is refused too (`qss_grid`: a data-revealed zero must not be an oracle)."""
    base = {"scope": scope, "mode": policy.mode.value, "k": policy.k}
    if decision.verdict == "withhold":
        return Gate(decision, {**base, "admitted": False, "skipped": "withheld by the rules"})
    stable = stable_query_set(output, ids, state.n_records)
    if stable is None:
        return Gate(decision, {**base, "admitted": False, "skipped": "no query set (script)"})
    try:
        extra = extra_stable_query_sets(output, ids, state.n_records)
        weighted = weighted_stable_sets(output, ids, state.n_records)
        admission = admit(state, [stable, *extra], policy, weighted)
    except QuerySetError as exc:
        raise AuditUnavailable(str(exc)) from exc
    facts = {**base, "admitted": bool(admission.admitted), **_json_facts(admission)}
    reason = admission.reason
    item: str | None = None
    if admission.admitted:
        labels = output_labels(output)
        current = origin_of(analysis, labels, admission)
        revealed = None
        if metadata is not None:
            started = time.perf_counter()
            revealed = data_revealed(admission, current, labels, origins or {}, metadata)
            facts["grid_ms"] = round((time.perf_counter() - started) * 1000, 3)
        if revealed is None:
            number = int(admission.facts.get("origin", -1))
            # the arrays in the order the admission refined the atoms by them (a delta replays it)
            arrays = (stable, *extra, *(w.cells for w in weighted))
            return Gate(decision, facts, admission.state, (number, current), arrays)
        facts.update(
            admitted=False, data_revealed_zero=True, conflicts_with=revealed.conflicts_with
        )
        reason, item = revealed.reason, "a zero difference"
    else:
        isolated = admission.smallest_isolated
        item = None if isolated is None else f"{isolated} record(s)"
    finding = Finding(check=CHECK, verdict="withhold", item=item, message=str(reason))
    findings = [*decision.findings, finding]
    withheld = decision.model_copy(update={"findings": findings, "verdict": combine(findings)})
    return Gate(withheld, facts)


def commit_for(
    files: StateFiles,
    scope: str,
    pointer: QssPointer | None,
    result: Gate,
    populations: ScopeState | None = None,
) -> QssCommit | None:
    """Write the admitted state, with the population decisions of `populations` (the state the
    output was admitted against, and the steps since its file), and describe the pointer move
    for `Store.settle_step`."""
    if result.state is None:
        return None
    before = populations if populations is not None else ScopeState(result.state)
    origins = dict(before.origins)
    if result.origin is not None:
        origins[result.origin[0]] = result.origin[1]
    if populations is None or not result.arrays:
        # nothing to replay from: a full state
        after = ScopeState(result.state, before.populations, origins, before.reserved)
    else:
        after = replace(before.refined(result.state, result.arrays), origins=origins)
    digest = files.save(scope, after)
    result.facts["state_sha256"] = digest
    return QssCommit(
        scope=scope,
        base=None if pointer is None else pointer.digest,
        digest=digest,
        n_records=result.state.n_records,
    )
