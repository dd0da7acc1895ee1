"""The auditor's state for one scope: an immutable value.

`atom_of[r]` is the atom of record id r; `sizes[a]` the number of records in atom a; `outside`
the atom of the records outside every admitted query set (-1 when there are none). The state
also carries the admitted aggregates as linear constraints over atoms (see `constraints.py`), in
both modes; a state admitted under `atoms` mode before issue 41 does not, and is audited by the
atoms rule with every cell that splits no atom refused (`admit`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from safeaccess.rules.qss.constraints import Constraints
from safeaccess.rules.qss.encoding import (
    Int32Array,
    Int64Array,
    StateFields,
    decode_fields,
    encode_fields,
)


def _frozen(array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    array.setflags(write=False)
    return array


class AuditState:
    """Atoms over record ids 0..n_records-1 and, when tracked, the admitted constraints."""

    __slots__ = ("_atom_of", "_constraints", "_n_query_sets", "_outside", "_sizes")

    def __init__(
        self,
        atom_of: Int32Array,
        sizes: Int64Array,
        outside: int,
        n_query_sets: int,
        constraints: Constraints | None,
    ) -> None:
        self._atom_of: Int32Array = _frozen(atom_of)  # type: ignore[assignment]
        self._sizes: Int64Array = _frozen(sizes)  # type: ignore[assignment]
        self._outside = outside
        self._n_query_sets = n_query_sets
        self._constraints = constraints

    @classmethod
    def empty(cls, n_records: int) -> AuditState:
        """No query set admitted yet: every record id in one atom (outside everything)."""
        if n_records < 0:
            raise ValueError(f"n_records must be >= 0, got {n_records}")
        m = 1 if n_records else 0
        return cls(
            atom_of=np.zeros(n_records, dtype=np.int32),
            sizes=np.full(m, n_records, dtype=np.int64),
            outside=0 if m else -1,
            n_query_sets=0,
            constraints=Constraints.empty(m),
        )

    @property
    def n_records(self) -> int:
        return int(self._atom_of.shape[0])

    @property
    def n_atoms(self) -> int:
        return int(self._sizes.shape[0])

    @property
    def n_constraints(self) -> int:
        """Linearly independent admitted query sets kept as constraints (0 when not tracked)."""
        return 0 if self._constraints is None else self._constraints.n_rows

    @property
    def n_query_sets(self) -> int:
        """Query sets (distinct cells) admitted so far, counting dependent ones."""
        return self._n_query_sets

    @property
    def tracks_constraints(self) -> bool:
        """Whether span mode can audit this state (False after atoms mode or past the cap)."""
        return self._constraints is not None

    @property
    def atom_of(self) -> Int32Array:
        """Read-only: the atom id of each record id."""
        return self._atom_of

    @property
    def sizes(self) -> Int64Array:
        """Read-only: the number of records in each atom."""
        return self._sizes

    @property
    def outside(self) -> int:
        """The atom of records outside every admitted query set, or -1."""
        return self._outside

    @property
    def constraints(self) -> Constraints | None:
        return self._constraints

    def grow(self, n_records: int) -> AuditState:
        """The same state over more record ids (a new dataset version): the new ids start
        outside every admitted query set, so they join the outside atom."""
        if n_records < self.n_records:
            raise ValueError(
                f"a state cannot shrink: it covers {self.n_records} record ids, asked for "
                f"{n_records} (record ids of removed records stay; pass the total id count)"
            )
        added = n_records - self.n_records
        if added == 0:
            return self
        outside = self._outside
        sizes = self._sizes.copy()
        constraints = self._constraints
        if outside < 0:
            outside = self.n_atoms
            sizes = np.concatenate([sizes, np.zeros(1, dtype=np.int64)])
            if constraints is not None:
                constraints = constraints.with_new_atom()
        sizes[outside] += added
        atom_of = np.concatenate([self._atom_of, np.full(added, outside, dtype=np.int32)])
        return AuditState(atom_of, sizes, outside, self._n_query_sets, constraints)

    def fields(self) -> StateFields:
        """The constructor arguments that rebuild this state (what the encoding stores)."""
        return StateFields(
            self._atom_of, self._sizes, self._outside, self._n_query_sets, self._constraints
        )

    def to_bytes(self) -> bytes:
        """The versioned binary encoding of this state (see `encoding.py`)."""
        return encode_fields(self.fields())

    @classmethod
    def from_bytes(cls, data: bytes) -> AuditState:
        """The state encoded in `data`; raise StateFormatError for anything else."""
        return cls(*decode_fields(data))

    def __repr__(self) -> str:
        return (
            f"AuditState(n_records={self.n_records}, n_atoms={self.n_atoms}, "
            f"n_constraints={self.n_constraints}, tracks_constraints={self.tracks_constraints})"
        )
