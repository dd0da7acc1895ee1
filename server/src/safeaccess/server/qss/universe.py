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
the encoded `AuditState`. `origins` holds, per admission, what its rows are (`qss_grid.Origin`:
the analysis and each row's cell label), so a later admission can tell a repeated query set
the definitions imply from one only the records imply; format 1 (no origins) is still read. A bare `AuditState` file (written before populations were admitted) decodes with
no population admitted, so its scope admits them at its next admission (refusing a population
an earlier "everyone but one" release already conflicts with: that scope keeps the old guard).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, ValidationError

from safeaccess.rules.qss import AuditPolicy, AuditState, QuerySetError, StateFormatError, admit
from safeaccess.server.qss.grid import Origin, origin_of

MAGIC = b"SASCOPE\0"
_LENGTH = struct.Struct(">I")

Outcome = Literal["admitted", "refused"]


class PopulationUnavailable(Exception):
    """A population's admission failed for a reason other than an isolated set (a chance event
    of the exact computation or a refusal for cost): the step should be retried."""


@dataclass(frozen=True)
class Population:
    """One dataset version's whole population: its record ids (stable across versions) and
    the number of record ids they span (the largest plus one)."""

    version: int
    ids: npt.NDArray[np.integer[Any]]
    span: int

    @classmethod
    def of(cls, version: int, ids: npt.NDArray[np.integer[Any]]) -> Population:
        """A version's population; computes its span once (a pass over the ids)."""
        return cls(version=version, ids=ids, span=int(ids.max()) + 1 if len(ids) else 0)


@dataclass(frozen=True)
class ScopeState:
    """A scope's auditor state and which versions' populations it has decided."""

    state: AuditState
    populations: Mapping[int, Outcome] = field(default_factory=dict)
    origins: Mapping[int, Origin] = field(default_factory=dict)


class _Header(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1, 2]
    populations: dict[int, Outcome]
    origins: dict[int, Origin] = {}


def encode(scope_state: ScopeState) -> bytes:
    """The state file's bytes: the envelope header, then the auditor's state."""
    header = json.dumps(
        {
            "format": 2,
            "populations": {str(v): o for v, o in sorted(scope_state.populations.items())},
            "origins": {
                str(k): o.model_dump(mode="json") for k, o in sorted(scope_state.origins.items())
            },
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode("utf-8")
    return MAGIC + _LENGTH.pack(len(header)) + header + scope_state.state.to_bytes()


def decode(raw: bytes) -> ScopeState:
    """A state file's contents; a bare `AuditState` (an older file) has no population decided.
    Raises StateFormatError for anything else."""
    if not raw.startswith(MAGIC):
        return ScopeState(AuditState.from_bytes(raw), {})
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
    return ScopeState(
        AuditState.from_bytes(raw[start + length :]),
        dict(header.populations),
        dict(header.origins),
    )


def records_needed(populations: Sequence[Population]) -> int:
    """The number of record ids the populations span (the largest id plus one)."""
    return max((p.span for p in populations), default=0)


def population_set(ids: npt.NDArray[np.integer[Any]], n_records: int) -> npt.NDArray[np.int32]:
    """A population as one query set over record ids: cell 0 on its records, -1 elsewhere."""
    array = np.full(n_records, -1, dtype=np.int32)
    array[ids] = 0
    return array


def admit_populations(
    scope_state: ScopeState, populations: Sequence[Population], policy: AuditPolicy
) -> tuple[ScopeState, dict[str, Any]]:
    """Admit, in version order, every population the scope has not decided yet.

    Returns the scope's state with them and the facts for the step's log (empty when nothing
    was new). Raises PopulationUnavailable when an admission fails without naming an isolated
    set (nothing is recorded, so the next step tries again)."""
    state = scope_state.state
    decided = dict(scope_state.populations)
    origins = dict(scope_state.origins)
    facts: dict[str, Any] = {}
    for population in sorted(populations, key=lambda p: p.version):
        if population.version in decided:
            continue
        if state.n_records < records_needed([population]):
            state = state.grow(records_needed([population]))
        try:
            admission = admit(state, [population_set(population.ids, state.n_records)], policy)
        except QuerySetError as exc:
            raise PopulationUnavailable(str(exc)) from exc
        if admission.admitted and admission.state is not None:
            origins[int(admission.facts.get("origin", -1))] = origin_of(None, [["all"]], admission)
            state = admission.state
            decided[population.version] = "admitted"
            facts.setdefault("versions_admitted", []).append(population.version)
        elif admission.smallest_isolated is not None:
            decided[population.version] = "refused"
            facts.setdefault("versions_refused", []).append(population.version)
            facts.setdefault("refusals", {})[str(population.version)] = admission.reason
        else:
            raise PopulationUnavailable(
                f"the population of version {population.version}: {admission.reason}"
            )
    return ScopeState(state, decided, origins), facts
