"""`review.decide`, the one code path of checker decisions (CLI and web): the two-person rule,
no self-review, a comment on rejection, approval with suppression or rounding; and the admin CLI
for checker accounts and the per-dataset rule."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pyotp
import pytest

from safeaccess.rules.outputs import CellFacts, TableFacts, TableOutput, public
from safeaccess.server.admin.cli import main
from safeaccess.server.config import DataDir
from safeaccess.server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from safeaccess.server.outcome import StepOutcome
from safeaccess.server.review import decisions as review
from safeaccess.server.review import rules as review_rules
from safeaccess.server.states import StepState
from safeaccess.server.store import Store, catalogue, sequences
from safeaccess.server.store.schema import StepRow
from safeaccess.server.web import accounts

# A one-way frequency table: the West cell holds 3 records and is flagged for review.
TABLE = TableOutput(
    source="frequency_table",
    statistic="count",
    row_vars=["region"],
    col_vars=[],
    row_labels=[["North"], ["South"], ["East"], ["West"]],
    col_labels=[[]],
    values=[[52.0], [47.0], [61.0], [3.0]],
    facts=TableFacts(cells=CellFacts(counts=[[52], [47], [61], [3]]), n_total=163),
)
DECISION = {
    "verdict": "review",
    "ruleset": "default@1",
    "ruleset_hash": "0" * 64,
    "findings": [
        {"check": "threshold", "verdict": "review", "item": "region=West", "message": "3 < 10"}
    ],
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    assert main(["init", "--data-dir", str(root), "--server-id", "sac-test"]) == 0
    return root


@pytest.fixture
def store(root: Path) -> Any:
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    store.add_project("p1")
    store.add_researcher("ada", "PEM", "fp", ["p1"])
    catalogue.add_dataset(
        store,
        name="d",
        version=1,
        project="p1",
        path="x",
        sha256="0",
        rows=1,
        metadata={},
        rules_path=None,
    )
    yield store
    store.close()


def _in_review(store: Store, n: int = 1) -> str:
    seq, _ = sequences.create_sequence(
        store,
        sequence_id=f"{n:032x}",
        researcher="ada",
        project="p1",
        dataset_id=1,
        header=f"h{n}".encode(),
        header_hash=f"hh{n}",
        nonce=f"n{n}",
        signature=b"s",
        endorsements=[],
        verifier_state={},
        first_step=StepRow(
            index=1,
            trace_hash="t",
            body=b'{"kind": "frequency_table"}',
            body_hash="b",
            last=False,
        ),
        event_data={},
    )
    full = TABLE.model_dump(mode="json")
    sequences.settle_step(
        store,
        seq.id,
        1,
        StepOutcome(
            state=StepState.REVIEW,
            kind="frequency_table",
            output=full,
            public_output=public(TABLE),
            decision=DECISION,
        ),
        {},
    )
    return seq.id


def _state(store: Store, seq_id: str) -> str:
    step = store.get_step(seq_id, 1)
    assert step is not None
    return step.state


def test_two_checkers_release_and_one_rejection_ends_it(store: Store) -> None:
    review_rules.set_checkers_required(store, "d", 2, actor="admin")
    seq_id = _in_review(store)
    assert review.decide(store, seq_id, 1, approve=True, reviewer="olivia") == "review"
    assert _state(store, seq_id) == "review"
    [item] = review.pending(store)
    assert item.approved_by == ("olivia",) and item.checkers_required == 2
    with pytest.raises(Conflict, match="different checker"):
        review.decide(store, seq_id, 1, approve=True, reviewer="olivia")
    assert review.decide(store, seq_id, 1, approve=True, reviewer="peter") == "released"
    kinds = [(e.kind, e.actor) for e in store.events(seq_id)]
    assert ("review_first_approval", "olivia") in kinds and ("review_approved", "peter") in kinds

    other = _in_review(store, 2)
    review.decide(store, other, 1, approve=True, reviewer="olivia")
    review.decide(store, other, 1, approve=False, reviewer="peter", note="no")
    assert _state(store, other) == "withheld"
    assert store.get_step(other, 1).review_note == "no"  # type: ignore[union-attr]


def test_a_first_approval_racing_another_is_refused(store: Store) -> None:
    # Two checkers (two CLI processes, or the CLI and the web) both saw no approval yet: the
    # later one must not record a second "first" approval.
    review_rules.set_checkers_required(store, "d", 2, actor="admin")
    seq_id = _in_review(store)
    review_rules.record_first_approval(store, seq_id, 1, "olivia", None, {})
    with pytest.raises(Conflict, match="meanwhile"):
        review_rules.record_first_approval(store, seq_id, 1, "peter", None, {})
    assert [a.checker for a in review_rules.first_approvals(store, seq_id, 1)] == ["olivia"]


def test_an_opening_rejection_needs_a_comment_and_is_never_her_own(store: Store) -> None:
    with pytest.raises(NotFound):
        review.decide_opening(store, "f" * 32, approve=False, reviewer="olivia", note="x")
    seq_id = _in_review(store)
    with pytest.raises(Forbidden):
        review.decide_opening(store, seq_id, approve=True, reviewer="ada")
    with pytest.raises(InvalidRequest, match="comment"):
        review.decide_opening(store, seq_id, approve=False, reviewer="olivia")


def test_one_checker_by_default_and_bad_settings_are_refused(store: Store) -> None:
    seq_id = _in_review(store)
    assert review.decide(store, seq_id, 1, approve=True, reviewer="olivia") == "released"
    with pytest.raises(InvalidRequest, match="1 or 2"):
        review_rules.set_checkers_required(store, "d", 3, actor="admin")
    with pytest.raises(NotFound):
        review_rules.set_checkers_required(store, "nope", 2, actor="admin")
    assert review_rules.checkers_required(store, "d") == 1


def test_nobody_reviews_her_own_output(store: Store) -> None:
    seq_id = _in_review(store)
    accounts.add_checker(store, "ada-checks", researcher="ada")
    for reviewer in ("ada", "ada-checks"):
        with pytest.raises(Forbidden, match="her own output"):
            review.decide(store, seq_id, 1, approve=True, reviewer=reviewer)
        with pytest.raises(Forbidden):
            review.decide(store, seq_id, 1, approve=False, reviewer=reviewer, note="x")
    assert _state(store, seq_id) == "review"


def test_a_rejection_needs_a_comment(store: Store) -> None:
    seq_id = _in_review(store)
    with pytest.raises(InvalidRequest, match="comment"):
        review.decide(store, seq_id, 1, approve=False, reviewer="olivia", note="  ")
    assert _state(store, seq_id) == "review"


def test_approve_with_suppression_or_rounding(store: Store) -> None:
    suppressed = _in_review(store)
    review.decide(
        store,
        suppressed,
        1,
        approve=True,
        reviewer="olivia",
        mitigation=review.Mitigation(suppress=True),
    )
    step = store.get_step(suppressed, 1)
    assert step is not None and step.public_output is not None
    values = step.public_output["values"]
    # West (3 records, flagged) is suppressed, and so is the smallest other cell of the column,
    # so West cannot be recovered from a total published elsewhere.
    assert values[3] == [None] and values[1] == [None]
    assert values[0] == [52.0] and values[2] == [61.0]
    assert "facts" not in step.public_output

    rounded = _in_review(store, 2)
    review.decide(
        store,
        rounded,
        1,
        approve=True,
        reviewer="olivia",
        mitigation=review.Mitigation(round_to=5),
    )
    step = store.get_step(rounded, 1)
    assert step is not None and step.public_output is not None
    assert step.public_output["values"] == [[50.0], [45.0], [60.0], [5.0]]
    assert step.public_output["rounded_to"] == 5


def test_a_second_checker_must_apply_the_same_mitigation(store: Store) -> None:
    review_rules.set_checkers_required(store, "d", 2, actor="admin")
    seq_id = _in_review(store)
    review.decide(
        store, seq_id, 1, approve=True, reviewer="olivia", mitigation=review.Mitigation(round_to=5)
    )
    with pytest.raises(Conflict, match="same"):
        review.decide(store, seq_id, 1, approve=True, reviewer="peter")
    review.decide(
        store, seq_id, 1, approve=True, reviewer="peter", mitigation=review.Mitigation(round_to=5)
    )
    step = store.get_step(seq_id, 1)
    assert step is not None and step.public_output is not None
    assert step.public_output["values"][3] == [5.0]


def test_a_mitigation_that_cannot_apply_changes_nothing(store: Store) -> None:
    seq_id = _in_review(store)
    with pytest.raises(Conflict, match="mitigation"):
        review.decide(
            store,
            seq_id,
            1,
            approve=True,
            reviewer="olivia",
            mitigation=review.Mitigation(round_to=0),
        )
    assert _state(store, seq_id) == "review"


def test_checker_accounts_from_the_cli(
    root: Path, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data-dir", str(root)]
    capsys.readouterr()
    assert main(["checker", "add", "olivia", "--base-url", "https://sac.example", *d]) == 0
    out = capsys.readouterr().out
    link = re.search(r"https://sac\.example/review/enrol\?token=(\S+)", out)
    assert link is not None
    token = link.group(1)
    assert main(["checker", "add", "olivia", *d]) == 2  # exists
    assert main(["checker", "add", "bad name", *d]) == 2
    assert main(["checker", "add", "x", "--researcher", "nobody", *d]) == 2
    # Only the token's hash is stored.
    with store.transaction() as s:
        from safeaccess.server.store.schema import CheckerRow

        row = s.get(CheckerRow, "olivia")
        assert (
            row is not None and row.enrol_token_sha256 != token and token not in str(row.__dict__)
        )
    found = accounts.enrolment_for(store, token)
    assert found is not None
    name, secret = found
    assert name == "olivia"
    totp = pyotp.TOTP(secret)
    with pytest.raises(InvalidRequest, match="at least"):
        accounts.enrol(store, token, "short", "short", totp.now())
    with pytest.raises(InvalidRequest, match="differ"):
        accounts.enrol(store, token, "a" * 12, "b" * 12, totp.now())
    code = totp.now()
    assert accounts.enrol(store, token, "p" * 14, "p" * 14, code) == "olivia"
    assert accounts.enrolment_for(store, token) is None  # single use
    # The enrolment's code was used: it cannot log in again (no replay in its window).
    assert accounts.authenticate(store, "olivia", "p" * 14, code) is None
    later = totp.at(time.time() + 30)  # the next time step's code, accepted once
    assert accounts.authenticate(store, "olivia", "p" * 14, later) == "olivia"
    assert accounts.authenticate(store, "olivia", "p" * 14, later) is None  # used once
    assert accounts.authenticate(store, "olivia", "wrong" * 3, later) is None
    assert main(["checker", "list", *d]) == 0
    assert "olivia  active" in capsys.readouterr().out
    assert main(["checker", "disable", "olivia", *d]) == 0
    assert not accounts.is_active(store, "olivia")
    assert main(["dataset", "checkers", "d", "2", *d]) == 0
    assert "two different checkers" in capsys.readouterr().out
    assert main(["dataset", "checkers", "d", "5", *d]) == 2
    assert review_rules.checkers_required(store, "d") == 2
