"""Listing and removing the centre's accounts and projects (the admin CLI's `list`/`remove`).

Removal never erases evidence: a researcher whose sequences are on record keeps her account
(auditors replay her signed headers against it), so `remove` refuses and says how to end her
access instead (remove her from her projects); a project with datasets or sequences stays too.
Every removal is an audit-log event in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select

from safeaccess.server import auditlog
from safeaccess.server.errors import Conflict, NotFound
from safeaccess.server.store import Store, web_sessions
from safeaccess.server.store.schema import (
    AuditorRow,
    CheckerRow,
    DatasetRow,
    MembershipRow,
    ProjectRow,
    ResearcherRow,
    SequenceRow,
)


@dataclass(frozen=True)
class Account:
    name: str
    fingerprint: str
    created_at: datetime
    projects: tuple[str, ...] = ()
    sequences: int = 0


@dataclass(frozen=True)
class Project:
    name: str
    created_at: datetime
    researchers: tuple[str, ...]
    datasets: tuple[str, ...]


def list_researchers(store: Store) -> list[Account]:
    with store.transaction() as s:
        rows = list(s.scalars(select(ResearcherRow).order_by(ResearcherRow.name)))
        members: dict[str, list[str]] = {}
        for m in s.scalars(select(MembershipRow).order_by(MembershipRow.project)):
            members.setdefault(m.researcher, []).append(m.project)
        counts: dict[str, int] = {
            str(name): int(n)
            for name, n in s.execute(
                select(SequenceRow.researcher, func.count()).group_by(SequenceRow.researcher)
            )
        }
        return [
            Account(
                r.name,
                r.fingerprint,
                r.created_at,
                tuple(members.get(r.name, [])),
                int(counts.get(r.name, 0)),
            )
            for r in rows
        ]


def remove_researcher(
    store: Store, name: str, projects: list[str] | None = None, *, actor: str = "admin"
) -> list[str]:
    """Remove the researcher from `projects` (or, when None, remove her account entirely);
    returns the projects she was removed from."""
    with store.transaction() as s:
        if s.get(ResearcherRow, name) is None:
            raise NotFound(f"researcher {name!r} does not exist")
        current = list(
            s.scalars(select(MembershipRow.project).where(MembershipRow.researcher == name))
        )
        if projects is not None:
            unknown = sorted(set(projects) - set(current))
            if unknown:
                raise NotFound(
                    f"researcher {name!r} is not in project(s) {', '.join(unknown)}; she is in "
                    f"{', '.join(sorted(current)) or 'none'}"
                )
            s.execute(
                delete(MembershipRow).where(
                    MembershipRow.researcher == name, MembershipRow.project.in_(projects)
                )
            )
            auditlog.append(
                s,
                "researcher_removed_from_projects",
                actor,
                {"researcher": name, "projects": projects},
            )
            return sorted(projects)
        sequences = s.scalar(
            select(func.count()).select_from(SequenceRow).where(SequenceRow.researcher == name)
        )
        if sequences:
            raise Conflict(
                f"researcher {name!r} has {sequences} sequence(s) on record, which auditors check "
                "against her key, so her account stays; to end her access remove her from her "
                f"projects: researcher remove {name} --project P (she is in "
                f"{', '.join(sorted(current)) or 'none'})"
            )
        s.execute(delete(MembershipRow).where(MembershipRow.researcher == name))
        s.execute(delete(ResearcherRow).where(ResearcherRow.name == name))
        auditlog.append(s, "researcher_removed", actor, {"researcher": name, "projects": current})
        return sorted(current)


def list_auditors(store: Store) -> list[Account]:
    with store.transaction() as s:
        return [
            Account(r.name, r.fingerprint, r.created_at)
            for r in s.scalars(select(AuditorRow).order_by(AuditorRow.name))
        ]


def remove_auditor(store: Store, name: str, *, actor: str = "admin") -> None:
    with store.transaction() as s:
        if s.get(AuditorRow, name) is None:
            raise NotFound(f"auditor {name!r} does not exist")
        s.execute(delete(AuditorRow).where(AuditorRow.name == name))
        auditlog.append(s, "auditor_removed", actor, {"auditor": name})


def list_projects(store: Store) -> list[Project]:
    with store.transaction() as s:
        out = []
        for p in s.scalars(select(ProjectRow).order_by(ProjectRow.name)):
            researchers = s.scalars(
                select(MembershipRow.researcher)
                .where(MembershipRow.project == p.name)
                .order_by(MembershipRow.researcher)
            )
            datasets = s.scalars(
                select(DatasetRow.name)
                .where(DatasetRow.project == p.name)
                .distinct()
                .order_by(DatasetRow.name)
            )
            out.append(Project(p.name, p.created_at, tuple(researchers), tuple(datasets)))
        return out


def remove_project(store: Store, name: str, *, actor: str = "admin") -> None:
    with store.transaction() as s:
        if s.get(ProjectRow, name) is None:
            raise NotFound(f"project {name!r} does not exist")
        datasets = s.scalar(
            select(func.count()).select_from(DatasetRow).where(DatasetRow.project == name)
        )
        sequences = s.scalar(
            select(func.count()).select_from(SequenceRow).where(SequenceRow.project == name)
        )
        if datasets or sequences:
            raise Conflict(
                f"project {name!r} has {datasets} dataset version(s) and {sequences} sequence(s) "
                "on record, so it stays; remove its researchers to end their access"
            )
        s.execute(delete(MembershipRow).where(MembershipRow.project == name))
        s.execute(delete(ProjectRow).where(ProjectRow.name == name))
        auditlog.append(s, "project_removed", actor, {"project": name})


def remove_checker(store: Store, name: str, *, actor: str = "admin") -> None:
    """Delete an output checker's web account (her decisions stay in the audit log)."""
    with store.transaction() as s:
        if s.get(CheckerRow, name) is None:
            raise NotFound(f"checker {name!r} does not exist")
        s.execute(delete(CheckerRow).where(CheckerRow.name == name))
        web_sessions.end_checker(s, name)  # logged out on every replica at once
        auditlog.append(s, "checker_removed", actor, {"checker": name})
