"""`safeaccess-server`: the controller's admin command line.

init, project/researcher/dataset registration, the review queue, serve, and the demo, written
once as a table of commands (`COMMANDS`): each row is a command's name, its help and arguments,
the function it calls and how its result prints (`table.py` says how a row runs). Commands that
only administer the database do not need a working sandbox; `serve` refuses to start without
one and says why. Exit codes: 0 success, 1 failure, 2 user error (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safeaccess.server.admin import accounts as admin_accounts
from safeaccess.server.admin import commands as do
from safeaccess.server.admin import db as admin_db
from safeaccess.server.admin import queue as admin_queue
from safeaccess.server.admin import sandbox as cli_sandbox
from safeaccess.server.admin import serving
from safeaccess.server.admin.table import (
    EXIT_USER_ERROR,
    USER_ERRORS,
    Command,
    Registrar,
    arg,
    build,
    lists,
    on_store,
    says,
)
from safeaccess.server.errors import ServiceError
from safeaccess.server.store import Store, catalogue

#: The command groups, with their help.
GROUPS = {
    "project": "projects",
    "researcher": "researchers",
    "auditor": "auditors",
    "dataset": "datasets",
    "checker": "output checkers' web accounts",
    "review": "the output checkers' queue",
    "key": "the centre's signing key",
}

NAME = arg("name", metavar="NAME")
#: `--public-key` (and `--key`, the spelling `auditor add` took first) on `researcher add` and
#: `auditor add` alike.
PUBLIC_KEY = arg(
    "--public-key",
    "--key",
    dest="public_key",
    type=Path,
    required=True,
    help="her Ed25519 public key PEM (also --key)",
)
LOG_OPTIONS = (
    arg(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="standard error's log lines: text, or JSON lines with request, sequence and step "
        "ids (default text)",
    ),
    arg(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="the least severe level logged (debug adds a failed job's traceback)",
    ),
)
SEQUENCE = arg("sequence", metavar="SEQUENCE_ID")
STEP = arg("step", metavar="STEP", type=int)
#: What a checker deciding gives: who she is (her password and code are asked), her note.
DECIDER = (
    arg(
        "--reviewer",
        default=None,
        help="your checker name (default: login name); your password and TOTP code are asked",
    ),
    arg(
        "--credentials-fd",
        type=int,
        default=None,
        metavar="N",
        help="read your password and TOTP code from file descriptor N, one per line (without a "
        "terminal; or set SAFEACCESS_CHECKER_PASSWORD and SAFEACCESS_CHECKER_CODE)",
    ),
    arg(
        "--note",
        default="",
        help="message to the researcher (she sees it with the decision; its hash is logged)",
    ),
)
QSS_OPTIONS = (
    arg(
        "--qss-mode",
        choices=("span", "atoms"),
        default=None,
        help="query-set auditing across releases: span (default) or the stricter atoms",
    ),
    arg(
        "--qss-scope",
        choices=("researcher", "project", "dataset"),
        default=None,
        help="whose releases are audited together (default project; fixed by the first version)",
    ),
    arg(
        "--qss-atom-cap",
        type=int,
        default=None,
        help="refuse, for cost and by that name, an output that would make more atoms "
        "(default 2000000)",
    ),
)


def _sandbox(sub: Any, _common: argparse.ArgumentParser) -> None:
    # The docker engineer's `sandbox build-image` / `sandbox check` commands.
    cli_sandbox.register(sub)


#: Every command, in the order `--help` lists them. Three modules register their own commands
#: where they stand: the sandbox's (`sandbox build-image | check`), the schema's (`db current |
#: upgrade`) and the job queue's (`queue status | failed | retry | fail`).
COMMANDS: tuple[Command[Any] | Registrar, ...] = (
    Command(
        ("init",),
        "create a data directory",
        serving.init,
        arguments=(
            arg("--server-id", default=None, help="this centre's id (default: random)"),
            arg(
                "--database-url",
                default=None,
                help="SQLAlchemy URL of the database, e.g. postgresql+psycopg://user@host/safeaccess "
                "(default: SQLite in the data directory)",
            ),
        ),
    ),
    # -- projects, researchers, auditors
    Command(
        ("project", "add"),
        "add a project",
        on_store(Store.add_project, "name"),
        says("project {name} added"),
        (NAME,),
    ),
    Command(
        ("project", "list"),
        "projects, members and datasets",
        on_store(admin_accounts.list_projects),
        lists(
            "no projects",
            lambda p: (
                f"{p.name}  researchers: {', '.join(p.researchers) or 'none'}  "
                f"datasets: {', '.join(p.datasets) or 'none'}"
            ),
        ),
    ),
    Command(
        ("project", "remove"),
        "remove a project without datasets or sequences",
        on_store(admin_accounts.remove_project, "name"),
        says("project {name} removed"),
        (NAME,),
    ),
    Command(
        ("researcher", "add"),
        "register a researcher's public key in projects",
        do.researcher_add,
        do.show_researcher_added,
        (
            NAME,
            PUBLIC_KEY,
            arg(
                "--project",
                action="append",
                required=True,
                help="project she belongs to (repeatable)",
            ),
        ),
    ),
    Command(
        ("researcher", "rotate-key"),
        "replace her key by one she authorised with her old key's signature",
        do.change_researcher_key(revoke=False),
        do.show_key_changed(revoke=False),
        (
            NAME,
            arg("--public-key", type=Path, required=True, help="her new public key PEM"),
            arg(
                "--signature",
                required=True,
                help="her old key's signature, from `safeaccess keys sign-rotation` (base64)",
            ),
        ),
    ),
    Command(
        ("researcher", "revoke-key"),
        "the centre replaces her key without her signature (logged; her client flags it)",
        do.change_researcher_key(revoke=True),
        do.show_key_changed(revoke=True),
        (
            NAME,
            arg("--public-key", type=Path, required=True, help="the new public key PEM"),
            arg("--reason", required=True, help="why (logged; she and auditors see it)"),
        ),
    ),
    Command(
        ("researcher", "list"),
        "researchers, their keys, projects and sequences",
        on_store(admin_accounts.list_researchers),
        lists(
            "no researchers",
            lambda r: (
                f"{r.name}  {r.fingerprint}  projects: "
                f"{', '.join(r.projects) or 'no project'}  sequences: {r.sequences}"
            ),
        ),
    ),
    Command(
        ("researcher", "remove"),
        "remove a researcher from projects, or her account (only without sequences)",
        on_store(admin_accounts.remove_researcher, "name", "project"),
        do.show_researcher_removed,
        (
            NAME,
            arg(
                "--project",
                action="append",
                default=None,
                metavar="P",
                help="remove her from this project only (repeatable); without it, the whole "
                "account",
            ),
        ),
    ),
    Command(
        ("auditor", "add"),
        "register an auditor's public key (audit endpoints only)",
        do.auditor_add,
        do.show_auditor_added,
        (NAME, PUBLIC_KEY),
    ),
    Command(
        ("auditor", "list"),
        "auditors and their keys",
        on_store(admin_accounts.list_auditors),
        lists("no auditors", lambda a: f"{a.name}  {a.fingerprint}  since {a.created_at:%Y-%m-%d}"),
    ),
    Command(
        ("auditor", "remove"),
        "remove an auditor",
        on_store(admin_accounts.remove_auditor, "name"),
        says("auditor {name} removed"),
        (NAME,),
    ),
    # -- datasets
    Command(
        ("dataset", "add"),
        "register a new immutable dataset version",
        do.dataset_add,
        do.show_dataset_added,
        (
            NAME,
            arg("--data", type=Path, required=True, help="CSV or Parquet file"),
            arg("--metadata", type=Path, required=True, help="metadata (JSON or YAML)"),
            arg(
                "--project",
                default=None,
                help="project the dataset belongs to (default: the only one)",
            ),
            arg("--rules", type=Path, default=None, help="rule-set overrides (YAML)"),
            *QSS_OPTIONS,
        ),
    ),
    Command(
        ("dataset", "codes"),
        "(re)build the integer code arrays the sandbox counts tables on",
        do.dataset_codes,
        says("dataset {name}: code arrays written to {result}"),
        (NAME, arg("--version", type=int, default=None, help="version (default: newest)")),
    ),
    Command(
        ("dataset", "list"),
        "list dataset versions",
        on_store(catalogue.all_datasets),
        lists(None, do.dataset_line),
    ),
    Command(
        ("dataset", "dp"),
        "enable or change differential privacy on a dataset (all its versions)",
        do.dataset_dp,
        do.show_dp,
        (
            NAME,
            arg("--epsilon", type=float, required=True, help="total epsilon of one ledger"),
            arg("--delta", type=float, required=True, help="delta the budget is stated at"),
            arg(
                "--scope",
                choices=["researcher", "project", "dataset"],
                default="researcher",
                help="whose releases share one ledger (default: each researcher)",
            ),
            arg(
                "--mandatory", action="store_true", help="refuse rule-checked kinds on this dataset"
            ),
            arg(
                "--max-tpr-at-5pct",
                type=float,
                default=None,
                help="withhold a release letting an attacker reach more than this TPR at FPR 0.05",
            ),
        ),
    ),
    Command(
        ("dataset", "mock"),
        "generate a DP synthetic mock of a dataset (charged to its public ledger); "
        "publish it in the catalogue with --publish after the checks pass",
        do.dataset_mock,
        do.show_mock,
        (
            NAME,
            arg("--epsilon", type=float, default=None, help="with --delta: the mock's privacy"),
            arg("--delta", type=float, default=None),
            arg("--mu", type=float, default=None, help="GDP mu of the mock (default 0.2)"),
            arg("--rows", type=int, default=1000, help="synthetic rows (1..10000)"),
            arg("--publish", action="store_true", help="publish it if the checks pass"),
        ),
    ),
    Command(
        ("dataset", "budget"),
        "a DP dataset's configuration and what each ledger spent",
        do.dataset_budget,
        do.show_budget,
        (NAME,),
    ),
    Command(
        ("dataset", "require-claim"),
        "require a trusted CA's claim (e.g. fair) for an analysis kind on a dataset; "
        "without --kind/--claim, list what is required",
        do.dataset_claims,
        do.show_claims,
        (
            NAME,
            arg("--kind", default=None, help="analysis kind, e.g. model_training"),
            arg("--claim", default=None, help="the claim (policy name) an endorsement must carry"),
            arg("--drop", action="store_true", help="stop requiring it"),
        ),
    ),
    Command(
        ("dataset", "checkers"),
        "show or set how many different output checkers must approve a release (1 or 2)",
        do.dataset_checkers,
        do.show_checkers,
        (NAME, arg("count", metavar="COUNT", type=int, nargs="?", default=None)),
    ),
    Command(
        ("dataset", "rules"),
        "change a dataset's rule set (YAML over the defaults) without registering it again",
        do.dataset_rules,
        do.show_rules,
        (
            NAME,
            arg("file", metavar="FILE", type=Path, help="rule-set YAML"),
            arg("--version", type=int, default=None, help="dataset version (default: the newest)"),
        ),
    ),
    # -- the output checkers' accounts
    Command(
        ("checker", "add"),
        "add a checker and print her one-time enrolment link",
        do.checker_add,
        do.show_enrolment,
        (
            NAME,
            arg(
                "--researcher",
                default=None,
                help="researcher identity this person also holds (she can never review its "
                "outputs)",
            ),
            arg(
                "--base-url",
                default="http://127.0.0.1:8000",
                help="the server's address as checkers reach it (for the link)",
            ),
        ),
    ),
    Command(
        ("checker", "list"), "list checkers", do.checker_list, lists("no checkers", do.checker_line)
    ),
    Command(
        ("checker", "disable"),
        "disable a checker's account",
        do.checker_disable,
        says("checker {name} disabled (a running session ends at its next request)"),
        (NAME,),
    ),
    Command(
        ("checker", "remove"),
        "delete a checker's account",
        on_store(admin_accounts.remove_checker, "name"),
        says("checker {name} removed (her decisions stay in the audit log)"),
        (NAME,),
    ),
    # -- the review queue
    Command(("review", "list"), "steps waiting for review", do.review_pending, do.show_pending),
    Command(
        ("review", "show"),
        "a step's analysis, findings and output, as released",
        do.review_step,
        do.show_step,
        (SEQUENCE, STEP),
    ),
    Command(
        ("review", "approve"),
        "release the step",
        do.review_decide,
        do.show_decided,
        (SEQUENCE, STEP, *DECIDER),
    ),
    Command(
        ("review", "reject"),
        "withhold the step (aborts the sequence)",
        do.review_decide,
        do.show_decided,
        (SEQUENCE, STEP, *DECIDER),
    ),
    Command(
        ("review", "openings"),
        "sequences past a withhold budget awaiting approval",
        do.review_openings,
        lists("no sequences wait for approval to open", do.opening_line),
    ),
    Command(
        ("review", "approve-opening"),
        "let a sequence past the withhold budget run",
        do.review_decide,
        do.show_opening_decided,
        (SEQUENCE, *DECIDER),
    ),
    Command(
        ("review", "reject-opening"),
        "refuse a sequence past the withhold budget (aborts it)",
        do.review_decide,
        do.show_opening_decided,
        (SEQUENCE, *DECIDER),
    ),
    # -- serving
    Command(
        ("serve",),
        "serve the HTTP API",
        serving.serve,
        arguments=(
            arg("--host", default="127.0.0.1"),
            arg("--port", type=int, default=8000),
            *LOG_OPTIONS,
        ),
    ),
    Command(
        ("worker",),
        "run steps from the job queue (execution: queue; connects out to PostgreSQL only)",
        serving.worker,
        arguments=(
            arg("--slots", type=int, default=2, help="interactive steps at once"),
            arg("--script-slots", type=int, default=1, help="script runs at once"),
            arg(
                "--backend",
                choices=["process", "docker"],
                default=None,
                help="sandbox backend (default: the configured one)",
            ),
            arg(
                "--queues",
                default="steps,scripts",
                help="queues to serve: steps, steps.<pool>, scripts (comma-separated)",
            ),
            arg("--name", default=None, help="this worker's name in logs (default: host)"),
            arg(
                "--metrics-port",
                type=int,
                default=None,
                help="serve Prometheus metrics on this port (/metrics; default: none)",
            ),
            arg(
                "--metrics-host",
                default="127.0.0.1",
                help="address of the metrics port (default 127.0.0.1; the private network's to "
                "scrape from another host)",
            ),
            *LOG_OPTIONS,
        ),
    ),
    Command(
        ("demo",),
        "run the end-to-end demo on an embedded server",
        serving.demo,
        arguments=(arg("--rows", type=int, default=20_000, help="people in the generated census"),),
    ),
    _sandbox,
    # db current / db upgrade: the schema's migrations.
    admin_db.register,
    # queue status / failed / retry / fail: the job queue.
    admin_queue.register,
    Command(
        ("key", "show"),
        "print the centre's public key (PEM) and its fingerprint",
        do.centre_key,
        do.show_key,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command of the table."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data directory (default: $SAFEACCESS_DATA, else ./safeaccess-data)",
    )
    parser = argparse.ArgumentParser(
        prog="safeaccess-server",
        description="safeaccess controller: administer the centre, serve the API, run the demo.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build(sub, common, COMMANDS, GROUPS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the admin CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
        return code
    except USER_ERRORS as exc:
        message = exc.message if isinstance(exc, ServiceError) else str(exc)
        print(f"safeaccess-server: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
