"""Rows admitted before any output: the populations of a dataset's versions.

The catalogue publishes every version's row count, so the count over each version's whole
population is released before a researcher asks anything. An auditor that does not know it
releases "everyone but one" (the catalogue's count minus a released count isolates one person)
and, worse for availability, lets that release make every colleague's whole-population table
the refused one. So each scope's state admits, before any output, every registered version's
population as one query set (all -1 but cell 0 on the version's record ids), in version order;
a version registered later is admitted at the scope's next admission.

A population can be refused: when a later version differs from an earlier one by fewer than k
records (a record removed or swapped), the two published counts already tell as much about
those records as the auditor allows. The refusal is recorded and that version's population is
not admitted; its whole-population outputs are then audited like any other query set (refused
while they would isolate the changed records). Which versions are admitted or refused is kept in
the state file, beside the auditor's state, so a refusal is decided once.

The file is an envelope: `MAGIC`, a 4-byte big-endian length, a JSON header
(`{"format": 2, "populations": {"<version>": "admitted" | "refused"}, "origins": {...}}`) and
the encoded `AuditState`, or (format 3) a delta: the header names the `parent` state file's
digest and the `depth` of deltas since the last full state, and the body is
`safeaccess.rules.qss.delta`'s steps from the parent. `origins` holds, per admission, what its rows are (`qss_grid.Origin`:
the analysis and each row's cell label), so a later admission can tell a repeated query set
the definitions imply from one only the records imply: a full state lists every admission's, a
delta those of the admissions since its parent (older deltas listed them all, which reads the
same); format 1 (no origins) is still read. A bare `AuditState` file (written before populations were admitted) decodes with
no population admitted, so its scope admits them at its next admission (refusing a population
an earlier "everyone but one" release already conflicts with: that scope keeps the old guard).
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, ValidationError

from safeaccess.rules.mitigation import secondary_suppression
from safeaccess.rules.qss import (
    AuditMode,
    AuditPolicy,
    AuditState,
    QuerySetError,
    StateFormatError,
    admit,
)
from safeaccess.rules.qss.delta import Grow, Refine, Step, apply_deltas, encode_delta
from safeaccess.rules.qss.encoding import decode_fields
from safeaccess.rules.qss.encoding import encode_parts as encode_state_parts
from safeaccess.server.qss.grid import Origin, origin_of

MAGIC = b"SASCOPE\0"
_DIGEST = 32  # the state's own SHA-256, at the end of an encoded state
_LENGTH = struct.Struct(">I")

Outcome = Literal["admitted", "refused"]
#: A reserved table's decision: admitted, refused by the auditor, or not reserved (a two-way
#: table with a cell below k: `_reserved_set`).
Reservation = Literal["admitted", "refused", "skipped"]


class PopulationUnavailable(Exception):
    """A population's admission failed for a reason other than an isolated set (a chance event
    of the exact computation or a refusal for cost): the step should be retried."""


@dataclass(frozen=True)
class Reserved:
    """A standard table reserved at a scope's start (`reserved_tables`): its name (the
    columns, e.g. `region*ethnicity`), its analysis as a researcher would send it, the cell
    labels of its query-set array, the array itself over the version's positions (a cell
    per record, -1 for none), before the threshold's suppression, and the width of the table's
    body (cell i is row i // width, column i % width; 1 for a one-way table)."""

    name: str
    analysis: dict[str, Any]
    labels: list[list[str]]
    cells: npt.NDArray[np.int32]
    width: int = 1


@dataclass(frozen=True)
class Population:
    """One dataset version's whole population: its record ids (stable across versions), the
    number of record ids they span (the largest plus one) and the standard tables reserved
    for it (`reserved_tables`)."""

    version: int
    ids: npt.NDArray[np.integer[Any]]
    span: int
    reserved: tuple[Reserved, ...] = ()

    @classmethod
    def of(
        cls,
        version: int,
        ids: npt.NDArray[np.integer[Any]],
        reserved: Sequence[Reserved] = (),
    ) -> Population:
        """A version's population; computes its span once (a pass over the ids)."""
        span = int(ids.max()) + 1 if len(ids) else 0
        return cls(version=version, ids=ids, span=span, reserved=tuple(reserved))


@dataclass(frozen=True)
class ScopeState:
    """A scope's auditor state and which versions' populations it has decided.

    `base` is the digest of the state file this value was loaded from (None for a new scope),
    `depth` that file's number of deltas since a full state, and `steps` what happened to the
    atoms since `base` (grown, refined by admitted arrays): enough to write the next file as a
    delta of `base` (`encode_file`)."""

    state: AuditState
    populations: Mapping[int, Outcome] = field(default_factory=dict)
    origins: Mapping[int, Origin] = field(default_factory=dict)
    #: The reserved standard tables decided, by "<version>:<name>" (`reserved_tables`).
    reserved: Mapping[str, Reservation] = field(default_factory=dict)
    base: str | None = None
    depth: int = 0
    steps: tuple[Step, ...] = ()
    #: The query-set count of the state `base` names: the admissions since are numbered from it
    #: on, so a delta's header lists only their origins (None: unknown, it lists them all).
    since: int | None = None

    def grown(self, n_records: int) -> ScopeState:
        """The same scope over at least `n_records` record ids (the new ids outside)."""
        if self.state.n_records >= n_records:
            return self
        return replace(self, state=self.state.grow(n_records), steps=(*self.steps, Grow(n_records)))

    def refined(self, state: AuditState, arrays: Sequence[npt.NDArray[Any]]) -> ScopeState:
        """`state`, the result of admitting `arrays` into this scope's state."""
        if state.n_atoms == self.state.n_atoms and state.outside == self.state.outside:
            # The arrays split no atom (a refinement only ever adds atoms, and keeps every id
            # when it adds none): the atoms are as they were, so the delta needs no step to
            # replay them, and the arrays (n_records bytes each) are neither hashed nor written.
            # Whether anything split depends on the records: like the auditor's other paths,
            # the time it saves is hidden from researchers by reply padding (`steps/timing.py`).
            return replace(self, state=state)
        return replace(self, state=state, steps=(*self.steps, *(Refine(a) for a in arrays)))


#: The parent a scope's first state file names: the state over no record ids and no query
#: set (`AuditState.empty(0)`), which needs no file. So the first admitted step of a scope
#: writes a delta (its grow and arrays) like every other, not a full state.
EMPTY = "empty"


def empty_scope(n_records: int) -> ScopeState:
    """A scope with nothing admitted yet, over `n_records` record ids, as a delta of `EMPTY`."""
    steps: tuple[Step, ...] = (Grow(n_records),) if n_records else ()
    return ScopeState(AuditState.empty(n_records), {}, base=EMPTY, steps=steps, since=0)


def empty_base() -> ScopeState:
    """The state `EMPTY` names: the base of a scope's first delta."""
    return ScopeState(AuditState.empty(0), {})


class _Header(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1, 2, 3]
    populations: dict[int, Outcome]
    origins: dict[int, Origin] = {}
    reserved: dict[str, Reservation] = {}
    parent: str | None = None
    depth: int = 0


class _OriginText:
    """Each admission's `Origin` as JSON text, made once per object (bounded, thread-safe).

    A scope's header lists the definitions of every admission so far, and every state file
    writes the header: dumping each `Origin` again per step cost O(admissions) per step (5 ms
    after 64 steps at 100 000 records). Origins are frozen, so their text never changes; the
    entries hold the object itself, so an id is never reused while its entry stands."""

    def __init__(self, size: int = 65_536):
        self._size = size
        self._entries: OrderedDict[int, tuple[Origin, str]] = OrderedDict()
        self._lock = threading.Lock()

    def text(self, origin: Origin) -> str:
        with self._lock:
            found = self._entries.get(id(origin))
            if found is not None and found[0] is origin:
                return found[1]
        text = json.dumps(origin.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        with self._lock:
            self._entries[id(origin)] = (origin, text)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return text


_ORIGIN_TEXT = _OriginText()


def _header(scope_state: ScopeState, parent: str | None, depth: int) -> bytes:
    """The envelope's JSON header (no spaces; the origins last, their texts made once). A
    delta's lists only the origins of the admissions since its parent (`ScopeState.since`):
    its reader has the parent's (`decode_chain`), and listing them all made every step's file,
    and its hashing, grow with the scope's history."""
    fields: dict[str, Any] = {
        "format": 2 if parent is None else 3,
        "populations": {str(v): o for v, o in sorted(scope_state.populations.items())},
    }
    if scope_state.reserved:  # absent in a scope that reserved nothing (and in older files)
        fields["reserved"] = dict(sorted(scope_state.reserved.items()))
    listed = scope_state.origins
    if parent is not None:
        fields.update(parent=parent, depth=depth)
        since = scope_state.since
        if since is not None:
            listed = {k: o for k, o in listed.items() if k >= since or k < 0}
    origins = ",".join(f'"{k}":{_ORIGIN_TEXT.text(o)}' for k, o in sorted(listed.items()))
    head = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return (head[:-1] + ',"origins":{' + origins + "}}").encode("utf-8")


def encode(scope_state: ScopeState) -> bytes:
    """The full state file's bytes: the envelope header, then the auditor's state."""
    return b"".join(encode_file(scope_state, delta=False))


def encode_file(scope_state: ScopeState, *, delta: bool) -> list[bytes | memoryview]:
    """A state file as buffers to hash and write in turn: a delta of `scope_state.base` (its
    steps since then) when `delta`, else the full state."""
    if delta:
        if scope_state.base is None:
            raise ValueError("a delta needs the state file it starts from")
        header = _header(scope_state, scope_state.base, scope_state.depth + 1)
        body = encode_delta(scope_state.state, scope_state.steps)
    else:
        header = _header(scope_state, None, 0)
        body = encode_state_parts(scope_state.state.fields())
    return [MAGIC + _LENGTH.pack(len(header)) + header, *body]


def sealed_name(head: bytes | memoryview, state_digest: bytes | memoryview) -> str:
    """The name of a full state file written in the background (`encode_file`'s parts: the
    envelope `head` first, the state's own SHA-256 last): the SHA-256 of the head and of that
    checksum, which covers the rest of the file. So the writer hashes the per-record array once
    (the state's checksum), not a second time for the file's name."""
    hasher = hashlib.sha256(head)
    hasher.update(state_digest)
    return hasher.hexdigest()


def decode_sealed(raw: bytes, name: str) -> ScopeState:
    """A full state file named by `sealed_name`: its head and state checksum checked against
    `name`, and the state against its checksum. Raises StateFormatError otherwise."""
    if not raw.startswith(MAGIC):
        raise StateFormatError("a full state file without the scope envelope")
    header, start = _read_header(raw)
    if header.parent is not None:
        raise StateFormatError("a full state file holds a delta")
    if len(raw) < start + _DIGEST or sealed_name(raw[:start], raw[-_DIGEST:]) != name:
        raise StateFormatError("the full state file does not match its name")
    state = AuditState(*decode_fields(memoryview(raw)[start:]))  # checks the state's SHA-256
    return ScopeState(state, dict(header.populations), dict(header.origins), dict(header.reserved))


def parent_of(raw: bytes) -> str | None:
    """The digest of the state file a state file is a delta of (None for a full state), from
    its header alone; raise StateFormatError when the header cannot be read."""
    return _read_header(raw)[0].parent if raw.startswith(MAGIC) else None


def _read_header(raw: bytes) -> tuple[_Header, int]:
    start = len(MAGIC) + _LENGTH.size
    if len(raw) < start:
        raise StateFormatError("the scope state's envelope is truncated")
    (length,) = _LENGTH.unpack(raw[len(MAGIC) : start])
    if len(raw) < start + length:
        raise StateFormatError("the scope state's header is truncated")
    try:
        header = _Header.model_validate_json(raw[start : start + length])
    except ValidationError as exc:
        raise StateFormatError(f"the scope state's header is invalid: {exc}") from exc
    if (header.format == 3) != (header.parent is not None):
        raise StateFormatError("the scope state's header names a parent only in format 3")
    return header, start + length


def decode(
    raw: bytes,
    parent: Callable[[str], ScopeState] | None = None,
    *,
    verified: bool = False,
) -> ScopeState:
    """A state file's contents; a bare `AuditState` (an older file) has no population decided.
    A delta (format 3) is replayed on its parent, which `parent(digest)` gives. `verified`:
    the caller checked `raw` against its content address (the SHA-256 of the whole file), so
    the state's own checksum is not computed again. Raises StateFormatError for anything else."""
    if not raw.startswith(MAGIC):
        return ScopeState(AuditState(*decode_fields(raw, verified=verified)), {})
    header, start = _read_header(raw)
    if header.parent is None:
        # a view, not a copy of the 40 MB a full state holds at 10 M records
        state = AuditState(*decode_fields(memoryview(raw)[start:], verified=verified))
        return ScopeState(
            state, dict(header.populations), dict(header.origins), dict(header.reserved)
        )
    if parent is None:
        raise StateFormatError("the scope state is a delta and its parent is not at hand")
    return decode_chain(parent(header.parent), [raw])


def decode_chain(base: ScopeState, raws: Sequence[bytes]) -> ScopeState:
    """The state of the last of `raws`, a chain of delta files each of the one before, the
    first a delta of `base`: every delta's steps are replayed on one atom array and only the
    last state is decoded (`delta.apply_deltas`). The caller has checked each file's digest
    and that each names the one before as its parent. Raises StateFormatError otherwise."""
    bodies = []
    header: _Header | None = None
    # A delta lists the origins of its own admissions (one written before it listed them all:
    # the same ones again), so the chain's are its base's and each delta's, in order.
    origins = dict(base.origins)
    for raw in raws:
        if not raw.startswith(MAGIC):
            raise StateFormatError("a delta's parent chain holds a bare state after its start")
        header, start = _read_header(raw)
        if header.parent is None:
            raise StateFormatError("a full state in the middle of a delta chain")
        origins.update(header.origins)
        bodies.append(memoryview(raw)[start:])
    if header is None:
        return base
    state = apply_deltas(base.state, bodies)
    return ScopeState(
        state, dict(header.populations), origins, dict(header.reserved), depth=header.depth
    )


def records_needed(populations: Sequence[Population]) -> int:
    """The number of record ids the populations span (the largest id plus one)."""
    return max((p.span for p in populations), default=0)


def population_set(ids: npt.NDArray[np.integer[Any]], n_records: int) -> npt.NDArray[np.int8]:
    """A population as one query set over record ids: cell 0 on its records, -1 elsewhere."""
    array = np.full(n_records, -1, dtype=np.int8)  # one cell: the narrowest cell type
    array[ids] = 0
    return array


def admit_populations(
    scope_state: ScopeState, populations: Sequence[Population], policy: AuditPolicy
) -> tuple[ScopeState, dict[str, Any]]:
    """Admit, in version order, every population the scope has not decided yet.

    Returns the scope's state with them and the facts for the step's log (empty when nothing
    was new). Raises PopulationUnavailable when an admission fails without naming an isolated
    set (nothing is recorded, so the next step tries again)."""
    current = scope_state
    decided = dict(scope_state.populations)
    origins = dict(scope_state.origins)
    reserved = dict(scope_state.reserved)
    facts: dict[str, Any] = {}
    for population in sorted(populations, key=lambda p: p.version):
        if population.version in decided:
            if decided[population.version] == "admitted":
                current = _reserve(current, population, policy, origins, reserved, facts)
            continue
        current = current.grown(records_needed([population]))
        array = population_set(population.ids, current.state.n_records)
        try:
            admission = admit(current.state, [array], policy)
        except QuerySetError as exc:
            raise PopulationUnavailable(str(exc)) from exc
        if admission.admitted and admission.state is not None:
            origins[int(admission.facts.get("origin", -1))] = origin_of(None, [["all"]], admission)
            current = current.refined(admission.state, [array])
            decided[population.version] = "admitted"
            facts.setdefault("versions_admitted", []).append(population.version)
            current = _reserve(current, population, policy, origins, reserved, facts)
        elif admission.smallest_isolated is not None or admission.facts.get("unsplit_cell"):
            # (`unsplit_cell`: a scope state without constraints, from atoms mode before it
            # kept them, cannot admit a set of whole atoms; recorded like a conflict)
            decided[population.version] = "refused"
            facts.setdefault("versions_refused", []).append(population.version)
            facts.setdefault("refusals", {})[str(population.version)] = admission.reason
        else:
            raise PopulationUnavailable(
                f"the population of version {population.version}: {admission.reason}"
            )
    return replace(current, populations=decided, origins=origins, reserved=reserved), facts


def _reserve(
    current: ScopeState,
    population: Population,
    policy: AuditPolicy,
    origins: dict[int, Origin],
    reserved: dict[str, Reservation],
    facts: dict[str, Any],
) -> ScopeState:
    """Admit the standard tables reserved for `population`'s version that the scope has not
    decided yet, in order, each as the threshold rule releases it (`_reserved_set`); one the
    auditor refuses (it conflicts with an earlier release, or its suppressed cells are
    determined) is recorded as refused and left to be audited like any output, as is a
    two-way table with a cell below k (recorded as skipped). Updates `origins`, `reserved`
    and `facts` in place.

    Only in span mode: the atoms rule refuses any output that leaves an atom below k, and the
    reserved tables' cross-classification would make its atoms so fine that ordinary outputs
    split them below k (a count of `age < 90` after them, on 3 000 people)."""
    if policy.mode is not AuditMode.SPAN:
        return current
    for table in population.reserved:
        key = f"{population.version}:{table.name}"
        if key in reserved:
            continue
        current = current.grown(records_needed([population]))
        found = _reserved_set(table, population.ids, current.state.n_records, policy.k)
        if found is None:
            reserved[key] = "skipped"
            facts.setdefault("tables_skipped", []).append(key)
            continue
        array, suppressed = found
        try:
            admission = admit(current.state, [array], policy)
        except QuerySetError as exc:
            raise PopulationUnavailable(str(exc)) from exc
        if admission.admitted and admission.state is not None:
            number = int(admission.facts.get("origin", -1))
            # with cells suppressed the reserved table is the one `suppress=True` releases
            analysis = _suppressed(table.analysis) if suppressed else table.analysis
            origins[number] = origin_of(analysis, table.labels, admission)
            current = current.refined(admission.state, [array])
            reserved[key] = "admitted"
            facts.setdefault("tables_reserved", []).append(key)
        elif (
            admission.smallest_isolated is not None
            or admission.facts.get("cost")
            or admission.facts.get("unsplit_cell")
        ):
            reserved[key] = "refused"
            facts.setdefault("tables_refused", []).append(key)
        else:
            raise PopulationUnavailable(f"the reserved table {key}: {admission.reason}")
    return current


def _reserved_set(
    table: Reserved, ids: npt.NDArray[np.integer[Any]], n_records: int, k: int
) -> tuple[npt.NDArray[np.int32], bool] | None:
    """A reserved table's query set over record ids, as the threshold rule releases it, and
    whether any cell was left out; None for a two-way table with a cell of 1 to k - 1 records.

    A one-way table with such cells is reserved as `suppress=True` releases it: those cells
    left out (-1), then the smallest other one (secondary suppression), so no suppressed cell
    is the catalogue's row count less the shown ones. (Primary suppression alone refused the
    3 000-person census' ethnicity table at reservation, its one small cell being the row count
    less the others, though no researcher can be released that table: without suppression the
    threshold rule withholds it whole.) A two-way table with such cells is not reserved: line
    by line secondary suppression does not protect it from its reserved, suppressed margins
    (the census' region x ethnicity table was refused so), and each such table cost the exact
    search 3 to 5 s of CPU at reservation on 3 000 records, where a table without small
    cells costs 0.01 to 0.1 s; a colleague asking for it without suppression is withheld by
    the threshold rule anyway."""
    cells = table.cells
    inside = cells >= 0
    width = max(table.width, 1)
    n_cells = max(len(table.labels[0]) if table.labels else 0, int(cells.max()) + 1)
    n_rows = -(-n_cells // width)
    grid = np.bincount(cells[inside], minlength=n_rows * width).reshape(n_rows, width)
    primary = (grid > 0) & (grid < k)
    if primary.any() and width > 1:
        return None
    hidden = secondary_suppression(grid, primary).reshape(-1)
    kept = np.where(inside & ~hidden[np.maximum(cells, 0)], cells, -1).astype(np.int32)
    array = np.full(n_records, -1, dtype=np.int32)
    array[ids] = kept
    return array, bool(hidden.any())


def _suppressed(analysis: dict[str, Any]) -> dict[str, Any]:
    """A reserved table's analysis as a researcher asks for its suppressed form."""
    mitigations = dict(analysis.get("mitigations") or {})
    mitigations["suppress"] = True
    return {**analysis, "mitigations": mitigations}
