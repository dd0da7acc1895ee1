"""Admin commands for a controller's daily work: the centre's key, listing and removing accounts
and projects, and changing a dataset's rule set without registering its data again.

Registered into the `safeaccess-server` parser by `register`; each handler returns an exit code
and reports user errors by raising the errors `cli.main` prints as one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.server.admin import accounts as admin_accounts
from safeaccess.server.config import DataDir, default_data_dir
from safeaccess.server.store import Store

T = TypeVar("T")

EXIT_OK = 0

SubParsers = Any  # argparse's private _SubParsersAction


def _data(args: argparse.Namespace) -> DataDir:
    return DataDir(args.data_dir if args.data_dir is not None else default_data_dir())


def _with_store(args: argparse.Namespace, action: Callable[..., T], *more: Any) -> T:
    """`action(store, *more)` on the data directory's store, closed afterwards."""
    store = _store(args)
    try:
        return action(store, *more)
    finally:
        store.close()


def _store(args: argparse.Namespace) -> Store:
    data = _data(args)
    return Store(data.database_url(data.load_config()))


def _key_show(args: argparse.Namespace) -> int:
    data = _data(args)
    config = data.load_config()
    public = data.load_signing_key().public_key()
    print(f"server id:   {config.server_id}")
    print(f"fingerprint: {fingerprint(public)}")
    print(public_key_text(public), end="")
    return EXIT_OK


def _researcher_list(args: argparse.Namespace) -> int:
    researchers = _with_store(args, admin_accounts.list_researchers)
    if not researchers:
        print("no researchers")
    for r in researchers:
        projects = ", ".join(r.projects) or "no project"
        print(f"{r.name}  {r.fingerprint}  projects: {projects}  sequences: {r.sequences}")
    return EXIT_OK


def _researcher_remove(args: argparse.Namespace) -> int:
    removed = _with_store(args, admin_accounts.remove_researcher, args.name, args.project)
    if args.project:
        print(f"researcher {args.name} removed from {', '.join(removed)}")
    else:
        print(f"researcher {args.name} removed (was in {', '.join(removed) or 'no project'})")
    return EXIT_OK


def _auditor_list(args: argparse.Namespace) -> int:
    auditors = _with_store(args, admin_accounts.list_auditors)
    if not auditors:
        print("no auditors")
    for a in auditors:
        print(f"{a.name}  {a.fingerprint}  since {a.created_at:%Y-%m-%d}")
    return EXIT_OK


def _auditor_remove(args: argparse.Namespace) -> int:
    _with_store(args, admin_accounts.remove_auditor, args.name)
    print(f"auditor {args.name} removed")
    return EXIT_OK


def _project_list(args: argparse.Namespace) -> int:
    projects = _with_store(args, admin_accounts.list_projects)
    if not projects:
        print("no projects")
    for p in projects:
        print(
            f"{p.name}  researchers: {', '.join(p.researchers) or 'none'}  "
            f"datasets: {', '.join(p.datasets) or 'none'}"
        )
    return EXIT_OK


def _project_remove(args: argparse.Namespace) -> int:
    _with_store(args, admin_accounts.remove_project, args.name)
    print(f"project {args.name} removed")
    return EXIT_OK


def _checker_remove(args: argparse.Namespace) -> int:
    _with_store(args, admin_accounts.remove_checker, args.name)
    print(f"checker {args.name} removed (her decisions stay in the audit log)")
    return EXIT_OK


def _dataset_rules(args: argparse.Namespace) -> int:
    from safeaccess.server.dataset_rules import set_rules

    data = _data(args)
    store = Store(data.database_url(data.load_config()))
    try:
        row, label, digest = set_rules(data, store, args.name, args.file, version=args.version)
    finally:
        store.close()
    print(
        f"dataset {row.name}@{row.version}: rule set {label} (sha256 {digest}) from the next "
        "step on; decisions made so far name the rule set they were made with"
    )
    return EXIT_OK


def register(
    sub: SubParsers,
    common: argparse.ArgumentParser,
    *,
    researcher: SubParsers,
    auditor: SubParsers,
    project: SubParsers,
    checker: SubParsers,
    dataset: SubParsers,
) -> None:
    """Add the commands of this module to the parser's groups."""
    key = sub.add_parser("key", help="the centre's signing key").add_subparsers(
        dest="key_command", required=True, metavar="ACTION"
    )
    kshow = key.add_parser(
        "show", parents=[common], help="print the centre's public key (PEM) and its fingerprint"
    )
    kshow.set_defaults(handler=_key_show)

    rlist = researcher.add_parser(
        "list", parents=[common], help="researchers, their keys, projects and sequences"
    )
    rlist.set_defaults(handler=_researcher_list)
    rremove = researcher.add_parser(
        "remove",
        parents=[common],
        help="remove a researcher from projects, or her account (only without sequences)",
    )
    rremove.add_argument("name", metavar="NAME")
    rremove.add_argument(
        "--project",
        action="append",
        default=None,
        metavar="P",
        help="remove her from this project only (repeatable); without it, the whole account",
    )
    rremove.set_defaults(handler=_researcher_remove)

    alist = auditor.add_parser("list", parents=[common], help="auditors and their keys")
    alist.set_defaults(handler=_auditor_list)
    aremove = auditor.add_parser("remove", parents=[common], help="remove an auditor")
    aremove.add_argument("name", metavar="NAME")
    aremove.set_defaults(handler=_auditor_remove)

    plist = project.add_parser("list", parents=[common], help="projects, members and datasets")
    plist.set_defaults(handler=_project_list)
    premove = project.add_parser(
        "remove", parents=[common], help="remove a project without datasets or sequences"
    )
    premove.add_argument("name", metavar="NAME")
    premove.set_defaults(handler=_project_remove)

    cremove = checker.add_parser("remove", parents=[common], help="delete a checker's account")
    cremove.add_argument("name", metavar="NAME")
    cremove.set_defaults(handler=_checker_remove)

    drules = dataset.add_parser(
        "rules",
        parents=[common],
        help="change a dataset's rule set (YAML over the defaults) without registering it again",
    )
    drules.add_argument("name", metavar="NAME")
    drules.add_argument("file", metavar="FILE", type=Path, help="rule-set YAML")
    drules.add_argument(
        "--version", type=int, default=None, help="dataset version (default: the newest)"
    )
    drules.set_defaults(handler=_dataset_rules)
