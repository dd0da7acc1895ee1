"""The mock dataset of a rehearsal: drawn from the metadata alone, within declared levels and
bounds, the published row count up to a cap, the same mock for the same metadata."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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


def test_published_shares_are_coarse_and_checked() -> None:
    from safeaccess.client.metadata import ColumnProfile, coarse_level_share, coarse_share

    # none; at least one but under 5 % is "some"; else the nearest multiple of 5, 100 only if all
    cases = [(0, "none"), (1, "some"), (49, "some"), (50, 5), (74, 5), (76, 10)]
    cases += [(974, 95), (999, 95), (1000, 100)]
    assert [coarse_share(count, 1000) for count, _ in cases] == [share for _, share in cases]
    assert coarse_level_share(0, 1000) == "some"  # an empty level is not told apart
    with pytest.raises(ValidationError, match="multiple of 5"):
        ColumnProfile(missing=7)
    with pytest.raises(ValidationError, match="2 level shares for 3 declared levels"):
        Column(
            name="x", type="categorical", levels=[1, 2, 3], profile=ColumnProfile(levels=[50, 50])
        )


def test_the_mock_has_the_published_missing_values_zeros_and_small_groups() -> None:
    from safeaccess.client.metadata import ColumnProfile

    meta = DatasetMetadata(
        name="survey",
        columns=[
            Column(
                name="income",
                type="continuous",
                bounds=(0, 1e5),
                profile=ColumnProfile(missing=10, zeros="some"),
            ),
            Column(
                name="kids",
                type="integer",
                bounds=(0, 3),
                profile=ColumnProfile(zeros="none"),
            ),
            Column(
                name="region",
                type="categorical",
                levels=["N", "S", "I"],
                profile=ColumnProfile(levels=[50, 50, "some"]),
            ),
            Column(name="old", type="integer", bounds=(0, 3)),  # no profile: drawn as before
        ],
    )
    frame = mock_frame(meta, 2000)
    assert int(frame["income"].isna().sum()) == 200  # 10 % of 2000
    assert int((frame["income"] == 0).sum()) == 20  # "some": 1 % of 2000
    assert not (frame["kids"] == 0).any() and frame["kids"].between(1, 3).all()
    islands = int((frame["region"] == "I").sum())
    assert 5 <= islands <= 45  # about 1 % of 2000 (weights 50:50:1), a small group
    assert (frame["old"] == 0).any()  # uniform on 0..3 as before
    notes = mock_notes(meta, 2000)
    assert (
        "income: the mock has the published 10 % missing values and under 5 % (1% on the mock) "
        "exact zeros"
    ) in notes
    assert "region: the mock draws its levels in the published shares" in notes
