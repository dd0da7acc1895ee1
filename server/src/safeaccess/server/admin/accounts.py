"""Listing and removing the centre's accounts and projects (the admin CLI's `list`/`remove`).

Removal never erases evidence: a researcher whose sequences are on record keeps her account
(auditors replay her signed headers against it), so `remove` refuses and says how to end her
access instead (remove her from her projects); a project with datasets or sequences stays too.
Every removal is an audit-log event in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from safeaccess.server.errors import Conflict, NotFound
from safeaccess.server.store import Store, accounts, auditlog, web_sessions


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
    """Every researcher with her projects and how many sequences she has on record."""
    with store.transaction() as s:
        rows = accounts.researchers(s)
        members = accounts.memberships(s)
        counts = accounts.sequence_counts(s)
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
        if not accounts.researcher_exists(s, name):
            raise NotFound(f"researcher {name!r} does not exist")
        current = accounts.projects_of(s, name)
        if projects is not None:
            unknown = sorted(set(projects) - set(current))
            if unknown:
                raise NotFound(
                    f"researcher {name!r} is not in project(s) {', '.join(unknown)}; she is in "
                    f"{', '.join(sorted(current)) or 'none'}"
                )
            accounts.leave_projects(s, name, projects)
            auditlog.append(
                s,
                "researcher_removed_from_projects",
                actor,
                {"researcher": name, "projects": projects},
            )
            return sorted(projects)
        sequences = accounts.count_sequences(s, researcher=name)
        if sequences:
            raise Conflict(
                f"researcher {name!r} has {sequences} sequence(s) on record, which auditors check "
                "against her key, so her account stays; to end her access remove her from her "
                f"projects: researcher remove {name} --project P (she is in "
                f"{', '.join(sorted(current)) or 'none'})"
            )
        accounts.delete_researcher(s, name)
        auditlog.append(s, "researcher_removed", actor, {"researcher": name, "projects": current})
        return sorted(current)


def list_auditors(store: Store) -> list[Account]:
    """Every auditor."""
    with store.transaction() as s:
        return [Account(r.name, r.fingerprint, r.created_at) for r in accounts.auditors(s)]


def remove_auditor(store: Store, name: str, *, actor: str = "admin") -> None:
    """Delete an auditor's account (her checks stay in the audit log)."""
    with store.transaction() as s:
        if not accounts.delete_auditor(s, name):
            raise NotFound(f"auditor {name!r} does not exist")
        auditlog.append(s, "auditor_removed", actor, {"auditor": name})


def list_projects(store: Store) -> list[Project]:
    """Every project with its researchers and datasets."""
    with store.transaction() as s:
        return [
            Project(
                p.name,
                p.created_at,
                tuple(accounts.project_members(s, p.name)),
                tuple(accounts.project_datasets(s, p.name)),
            )
            for p in accounts.projects(s)
        ]


def remove_project(store: Store, name: str, *, actor: str = "admin") -> None:
    """Delete a project that holds no dataset and no sequence."""
    with store.transaction() as s:
        if not accounts.project_exists(s, name):
            raise NotFound(f"project {name!r} does not exist")
        datasets = accounts.count_dataset_versions(s, name)
        sequences = accounts.count_sequences(s, project=name)
        if datasets or sequences:
            raise Conflict(
                f"project {name!r} has {datasets} dataset version(s) and {sequences} sequence(s) "
                "on record, so it stays; remove its researchers to end their access"
            )
        accounts.delete_project(s, name)
        auditlog.append(s, "project_removed", actor, {"project": name})


def remove_checker(store: Store, name: str, *, actor: str = "admin") -> None:
    """Delete an output checker's web account (her decisions stay in the audit log)."""
    with store.transaction() as s:
        if not accounts.delete_checker(s, name):
            raise NotFound(f"checker {name!r} does not exist")
        web_sessions.end_checker(s, name)  # logged out on every replica at once
        auditlog.append(s, "checker_removed", actor, {"checker": name})
