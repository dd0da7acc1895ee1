"""The mock dataset of a rehearsal: drawn from the metadata alone, within declared levels and
bounds, the published row count up to a cap, the same mock for the same metadata."""

from __future__ import annotations

from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.sandbox.mock.data import (
    MAX_MOCK_ROWS,
    UNDECLARED_LEVELS,
    mock_frame,
    mock_notes,
)

META = DatasetMetadata(
    name="census",
    columns=[
        Column(name="person_id", type="identifier"),
        Column(name="employer", type="identifier", contributor=True),
        Column(name="age", type="integer", bounds=(16, 95)),
        Column(name="income", type="continuous", bounds=(0, 1e5)),
        Column(name="health", type="ordinal", levels=[1, 2, 3], scale=(1, 3)),
        Column(name="sex", type="categorical", levels=["F", "M"]),
        Column(name="job", type="categorical"),
        Column(name="score", type="continuous"),
    ],
)


def test_mock_respects_the_metadata_and_is_reproducible() -> None:
    frame = mock_frame(META, 5000, version=2)
    assert list(frame.columns) == [c.name for c in META.columns] and len(frame) == 5000
    assert frame.person_id.is_unique
    assert frame.age.between(16, 95).all() and frame.age.dtype.kind == "i"
    assert frame.income.between(0, 1e5).all()
    assert set(frame.sex) == {"F", "M"} and set(frame.health) == {1, 2, 3}
    assert set(frame.job) == set(UNDECLARED_LEVELS)
    assert frame.equals(mock_frame(META, 5000, version=2))
    assert not frame.equals(mock_frame(META, 5000, version=3))
    assert len(mock_frame(META, 10**7)) == MAX_MOCK_ROWS


def test_mock_notes_say_what_was_invented() -> None:
    notes = mock_notes(META, 10**7)
    assert any(f"{MAX_MOCK_ROWS} rows" in n for n in notes)
    assert any(n.startswith("job: no declared levels") for n in notes)
    assert any(n.startswith("score: no declared bounds") for n in notes)
    assert not any(n.startswith(("age", "income", "sex")) for n in notes)
