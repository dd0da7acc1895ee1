"""The rows of the centre's accounts: researchers' memberships, auditors, projects (for the admin
CLI's `list`/`remove`, `safeaccess.server.admin.accounts`) and the output checkers' web accounts
(`safeaccess.server.web.accounts`). Session-level: each runs in the caller's transaction, and
the rules (what may be removed, how a password or a code is checked) stay with the callers.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import (
    AuditorRow,
    CheckerRow,
    DatasetRow,
    MembershipRow,
    ProjectRow,
    ResearcherRow,
    SequenceRow,
)

# -- researchers ---------------------------------------------------------------------------------


def researchers(s: Session) -> list[ResearcherRow]:
    """Every researcher, by name."""
    return list(s.scalars(select(ResearcherRow).order_by(ResearcherRow.name)))


def researcher_exists(s: Session, name: str) -> bool:
    """Whether researcher `name` is registered."""
    return s.get(ResearcherRow, name) is not None


def memberships(s: Session) -> dict[str, list[str]]:
    """researcher -> her projects, each list sorted."""
    members: dict[str, list[str]] = {}
    for m in s.scalars(select(MembershipRow).order_by(MembershipRow.project)):
        members.setdefault(m.researcher, []).append(m.project)
    return members


def projects_of(s: Session, researcher: str) -> list[str]:
    """The projects `researcher` is in (in no particular order)."""
    return list(
        s.scalars(select(MembershipRow.project).where(MembershipRow.researcher == researcher))
    )


def sequence_counts(s: Session) -> dict[str, int]:
    """researcher -> how many sequences she has on record (absent: none)."""
    return {
        str(name): int(n)
        for name, n in s.execute(
            select(SequenceRow.researcher, func.count()).group_by(SequenceRow.researcher)
        )
    }


def count_sequences(
    s: Session, *, researcher: str | None = None, project: str | None = None
) -> int:
    """How many sequences a researcher (or a project) has on record."""
    query = select(func.count()).select_from(SequenceRow)
    if researcher is not None:
        query = query.where(SequenceRow.researcher == researcher)
    if project is not None:
        query = query.where(SequenceRow.project == project)
    return int(s.scalar(query) or 0)


def leave_projects(s: Session, researcher: str, projects: list[str]) -> None:
    """Remove a researcher from `projects`."""
    s.execute(
        delete(MembershipRow).where(
            MembershipRow.researcher == researcher, MembershipRow.project.in_(projects)
        )
    )


def delete_researcher(s: Session, name: str) -> None:
    """Delete a researcher's account and memberships."""
    s.execute(delete(MembershipRow).where(MembershipRow.researcher == name))
    s.execute(delete(ResearcherRow).where(ResearcherRow.name == name))


# -- auditors ------------------------------------------------------------------------------------


def auditors(s: Session) -> list[AuditorRow]:
    """Every auditor, by name."""
    return list(s.scalars(select(AuditorRow).order_by(AuditorRow.name)))


def delete_auditor(s: Session, name: str) -> bool:
    """Delete an auditor's account; False if there was none."""
    if s.get(AuditorRow, name) is None:
        return False
    s.execute(delete(AuditorRow).where(AuditorRow.name == name))
    return True


# -- projects ------------------------------------------------------------------------------------


def projects(s: Session) -> list[ProjectRow]:
    """Every project, by name."""
    return list(s.scalars(select(ProjectRow).order_by(ProjectRow.name)))


def project_exists(s: Session, name: str) -> bool:
    """Whether project `name` exists."""
    return s.get(ProjectRow, name) is not None


def project_members(s: Session, project: str) -> list[str]:
    """The researchers of a project, sorted."""
    return list(
        s.scalars(
            select(MembershipRow.researcher)
            .where(MembershipRow.project == project)
            .order_by(MembershipRow.researcher)
        )
    )


def project_datasets(s: Session, project: str) -> list[str]:
    """The names of a project's datasets, sorted, each once."""
    return list(
        s.scalars(
            select(DatasetRow.name)
            .where(DatasetRow.project == project)
            .distinct()
            .order_by(DatasetRow.name)
        )
    )


def count_dataset_versions(s: Session, project: str) -> int:
    """How many dataset versions a project holds."""
    query = select(func.count()).select_from(DatasetRow).where(DatasetRow.project == project)
    return int(s.scalar(query) or 0)


def delete_project(s: Session, name: str) -> None:
    """Delete a project and its memberships."""
    s.execute(delete(MembershipRow).where(MembershipRow.project == name))
    s.execute(delete(ProjectRow).where(ProjectRow.name == name))


# -- output checkers' web accounts ---------------------------------------------------------------


def checkers(s: Session) -> list[CheckerRow]:
    """Every checker account, by name."""
    return list(s.scalars(select(CheckerRow).order_by(CheckerRow.name)))


def checker(s: Session, name: str, *, lock: bool = False) -> CheckerRow | None:
    """A checker account by name (FOR UPDATE with `lock`)."""
    return s.get(CheckerRow, name, with_for_update=lock)


def checker_by_token(s: Session, token_sha256: str, *, lock: bool = False) -> CheckerRow | None:
    """The checker account whose enrolment token has this SHA-256 (FOR UPDATE with `lock`)."""
    query = select(CheckerRow).where(CheckerRow.enrol_token_sha256 == token_sha256)
    if lock:
        query = query.with_for_update()
    return s.scalars(query).first()


def add_checker(
    s: Session,
    name: str,
    *,
    researcher: str | None,
    totp_secret: str,
    token_sha256: str,
    expires_at: datetime,
) -> None:
    """A pending checker account waiting for its enrolment."""
    s.add(
        CheckerRow(
            name=name,
            researcher=researcher,
            state="pending",
            totp_secret=totp_secret,
            enrol_token_sha256=token_sha256,
            enrol_expires_at=expires_at,
        )
    )


def activate_checker(row: CheckerRow, password_hash: str) -> None:
    """An enrolled account: its password set, its token spent."""
    row.password_hash = password_hash
    row.state = "active"
    row.enrol_token_sha256 = None
    row.enrol_expires_at = None


def disable_checker(row: CheckerRow) -> None:
    """A disabled account (its pending token, if any, spent too)."""
    row.state = "disabled"
    row.enrol_token_sha256 = None


def accept_totp_step(row: CheckerRow, step: int) -> None:
    """Remember the time step of the code just accepted (no code of it or before is again)."""
    row.last_totp_step = step


def delete_checker(s: Session, name: str) -> bool:
    """Delete a checker account; False if there was none."""
    if s.get(CheckerRow, name) is None:
        return False
    s.execute(delete(CheckerRow).where(CheckerRow.name == name))
    return True
