"""The auditor's replay of output checkers' records: the two-person rule per dataset and no
self-review are re-checked from the log alone (records of the web workspace and of the CLI)."""

from __future__ import annotations

from typing import Any

import pytest

from safeaccess.client.audit.records import LogRecord
from safeaccess.client.audit.verify import AuditFailure, Report, _Replay, _Sequence

SEQ = "a" * 32


def _record(index: int, kind: str, actor: str, data: dict[str, Any] | None = None) -> LogRecord:
    return LogRecord(
        log="safeaccess-audit",
        version=1,
        index=index,
        time="2026-01-01T00:00:00.000000Z",
        kind=kind,
        actor=actor,
        sequence=SEQ if kind.startswith("review_") and kind != "review_settings" else None,
        step=1 if kind.startswith("review_") and kind != "review_settings" else None,
        data=data or {},
    )


def _replay(checkers: int) -> _Replay:
    """A replay whose sequence of researcher ada on dataset `ledger` has step 1 in review (the
    records before are checked by the other tests of the verifier)."""
    replay = _Replay(Report())
    replay.feed(_record(0, "review_settings", "admin", {"dataset": "ledger", "checkers": checkers}))
    replay.feed(_record(1, "checker_added", "admin", {"checker": "ada-c", "researcher": "ada"}))
    replay.sequences[SEQ] = _Sequence(
        researcher="ada",
        previous_trace=b"",
        state="review",
        step=1,
        verdict="review",
        dataset="ledger",
    )
    return replay


RELEASE = {"output_commitment": "c" * 64}


def test_two_different_checkers_release_on_a_two_checker_dataset() -> None:
    replay = _replay(2)
    replay.feed(_record(2, "review_viewed", "olivia"))
    replay.feed(_record(3, "review_first_approval", "olivia"))
    replay.feed(_record(4, "review_approved", "peter", RELEASE))
    assert replay.report.steps_released == 1


def test_a_release_by_one_checker_on_a_two_checker_dataset_fails() -> None:
    replay = _replay(2)
    with pytest.raises(AuditFailure, match="needs 2 different checkers"):
        replay.feed(_record(2, "review_approved", "peter", RELEASE))


def test_one_checker_giving_both_approvals_fails() -> None:
    replay = _replay(2)
    replay.feed(_record(2, "review_first_approval", "olivia"))
    with pytest.raises(AuditFailure, match="both approvals"):
        replay.feed(_record(3, "review_approved", "olivia", RELEASE))


@pytest.mark.parametrize("actor", ["ada", "ada-c"])
@pytest.mark.parametrize("kind", ["review_first_approval", "review_approved", "review_rejected"])
def test_a_researcher_reviewing_her_own_output_fails(actor: str, kind: str) -> None:
    replay = _replay(1)
    with pytest.raises(AuditFailure, match="her own sequence"):
        replay.feed(_record(2, kind, actor, RELEASE))


def test_one_checker_suffices_by_default() -> None:
    replay = _replay(1)
    replay.feed(_record(2, "review_approved", "peter", RELEASE))
    assert replay.report.steps_released == 1
