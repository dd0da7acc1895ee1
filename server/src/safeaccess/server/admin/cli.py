"""`safeaccess-server`: the controller's admin command line.

init, project/researcher/dataset registration, the review queue, serve, and the demo. Commands
that only administer the database do not need a working sandbox; `serve` refuses to start without
one and says why. Exit codes: 0 success, 1 failure, 2 user error (one line on stderr).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safeaccess.client.httpsig import valid_keyid
from safeaccess.client.keys import KeyFileError, fingerprint, load_public_key, public_key_text
from safeaccess.server.admin import commands as cli_admin
from safeaccess.server.admin import db as admin_db
from safeaccess.server.admin import queue as admin_queue
from safeaccess.server.admin import sandbox as cli_sandbox
from safeaccess.server.config import DataDir, default_data_dir, initialise
from safeaccess.server.errors import ConfigError, Forbidden, ServiceError
from safeaccess.server.store import Store, catalogue, ledgers
from safeaccess.server.store.migrate import SchemaBehind

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USER_ERROR = 2

USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    ServiceError,
    KeyFileError,
    OSError,
    SchemaBehind,
)


def _data(args: argparse.Namespace) -> DataDir:
    return DataDir(args.data_dir if args.data_dir is not None else default_data_dir())


def _store(data: DataDir) -> Store:
    return Store(data.database_url(data.load_config()))


def _database_problem(url: str, exc: Exception) -> ConfigError:
    """A database `init` cannot use, in one line with what to do."""
    from sqlalchemy.exc import ArgumentError

    if isinstance(exc, ArgumentError):
        return ConfigError(
            "--database-url is not a database URL (e.g. postgresql+psycopg://user@host/safeaccess)"
        )
    if isinstance(exc, ModuleNotFoundError):
        return ConfigError(
            f"the database driver is not installed ({exc.name}): install the server with its "
            "postgresql extra, e.g. pip install 'safeaccess-server[postgresql]'"
        )
    text = str(getattr(exc, "orig", None) or exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    hint = ""
    if "no password supplied" in first or "password authentication failed" in first:
        hint = (
            "; give the password in a libpq password file (mode 0600) and set PGPASSFILE to it "
            "before running init (docs/deploy.md, step 3)"
        )
    return ConfigError(f"cannot use the database {_redacted(url)}: {first}{hint}")


def _init(args: argparse.Namespace) -> int:
    """Create the data directory, its key and its database's schema: all of them, or, when
    any step fails, none (a retry then starts afresh instead of "already initialised")."""
    data = _data(args)
    if args.database_url is not None and not (data.config_path.exists() or data.key_path.exists()):
        # Reach the database before anything is written: the commonest failure (no password,
        # a wrong host) then leaves nothing behind to clean up.
        _probe_database(args.database_url)
    existed = data.root.exists()
    config = initialise(data.root, server_id=args.server_id, database_url=args.database_url)
    try:
        _store(data).close()
    except Exception as exc:
        _undo_init(data, existed)
        url = data.database_url(config)
        if isinstance(exc, USER_ERRORS):
            raise
        raise _database_problem(url, exc) from exc
    print(f"initialised {data.root}")
    print(f"  database:    {_redacted(data.database_url(config))}")
    print(f"  server id:   {config.server_id}")
    print(f"  config:      {data.config_path} (sandbox backend: {config.sandbox.backend})")
    print(f"  signing key: {data.key_path} (mode 0600)")
    return EXIT_OK


def _probe_database(url: str) -> None:
    """Connect to the database at `url` once, or raise a one-line ConfigError."""
    from safeaccess.server.store.reachable import probe

    try:
        probe(url)
    except Exception as exc:
        raise _database_problem(url, exc) from exc


def _undo_init(data: DataDir, existed: bool) -> None:
    """Remove what a failed `init` created: its config, its key, its empty folders (a SQLite
    database it made goes too, with the folder it is in)."""
    import contextlib
    import shutil

    for path in (data.config_path, data.key_path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if not existed:
        shutil.rmtree(data.root, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        data.datasets.rmdir()  # only if empty


def _redacted(url: str) -> str:
    """A database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _project_add(args: argparse.Namespace) -> int:
    store = _store(_data(args))
    try:
        store.add_project(args.name)
    finally:
        store.close()
    print(f"project {args.name} added")
    return EXIT_OK


def _researcher_add(args: argparse.Namespace) -> int:
    if not valid_keyid(args.name):
        raise ConfigError(
            f"researcher name {args.name!r}: use up to 128 letters, digits and _ . @ - "
            "(it is the key id her requests are signed with)"
        )
    key = load_public_key(args.public_key)
    store = _store(_data(args))
    try:
        store.add_researcher(args.name, public_key_text(key), fingerprint(key), args.project)
    finally:
        store.close()
    print(f"researcher {args.name} ({fingerprint(key)}) in {', '.join(args.project)}")
    return EXIT_OK


def _researcher_change_key(args: argparse.Namespace, *, revoke: bool) -> int:
    key = load_public_key(args.public_key)
    data = _data(args)
    config = data.load_config()
    store = Store(data.database_url(config))
    try:
        entry = catalogue.change_researcher_key(
            store,
            args.name,
            public_key_text(key),
            fingerprint(key),
            server_id=config.server_id,
            signature=None if revoke else args.signature.strip(),
            reason=args.reason if revoke else None,
        )
    finally:
        store.close()
    verb = "revoked (her client flags it at her next connection)" if revoke else "rotated"
    print(f"researcher {args.name}: key {verb}; now {fingerprint(key)} (audit log entry {entry})")
    return EXIT_OK


def _researcher_rotate_key(args: argparse.Namespace) -> int:
    return _researcher_change_key(args, revoke=False)


def _researcher_revoke_key(args: argparse.Namespace) -> int:
    return _researcher_change_key(args, revoke=True)


def _qss_settings(args: argparse.Namespace, store: Any) -> Any:
    """The auditor settings asked for on the command line (over the dataset's current ones)."""
    from safeaccess.server.config import QssSettings

    asked = {
        key: value
        for key, value in (
            ("mode", args.qss_mode),
            ("scope", args.qss_scope),
            ("atom_cap", args.qss_atom_cap),
        )
        if value is not None
    }
    if not asked:
        return None
    current = store.qss_settings(args.name)
    return QssSettings(**{**current.model_dump(), **asked})


def _auditor_add(args: argparse.Namespace) -> int:
    if not valid_keyid(args.name):
        raise ConfigError(
            f"auditor name {args.name!r}: use up to 128 letters, digits and _ . @ - "
            "(it is the key id her requests are signed with)"
        )
    key = load_public_key(args.public_key)
    store = _store(_data(args))
    try:
        store.add_auditor(args.name, public_key_text(key), fingerprint(key))
    finally:
        store.close()
    print(f"auditor {args.name} ({fingerprint(key)}): may read the audit log, nothing else")
    return EXIT_OK


def _dataset_add(args: argparse.Namespace) -> int:
    from safeaccess.server.datasets import (
        load_metadata,
        missing_markers,
        read_table,
        register_dataset,
    )

    data = _data(args)
    store = _store(data)
    try:
        project = args.project
        if project is None:
            # Without --project the choice is obvious only when the centre has one project.
            names = catalogue.project_names(store)
            if len(names) != 1:
                raise ConfigError(
                    "give the dataset's project with --project P (projects: "
                    + (", ".join(names) or "none yet; add one with 'project add'")
                    + ")"
                )
            project = names[0]
        metadata = load_metadata(args.metadata)
        # A dataset the jobs query through DuckDB is larger than memory: never loaded whole.
        streamed = metadata.storage == "duckdb"
        row = register_dataset(
            data,
            store,
            name=args.name,
            frame=None if streamed else read_table(args.data),
            source=args.data if streamed else None,
            metadata=metadata,
            project=project,
            rules_file=args.rules,
            qss=_qss_settings(args, store),
        )
    finally:
        store.close()
    print(f"dataset {row.name} version {row.version}: {row.rows} rows, sha256 {row.sha256}")
    markers = missing_markers(args.data)
    if markers:
        print("read as missing values (pandas' NA markers; check none of them is a real value):")
        for note in markers:
            print(f"  {note}")
    return EXIT_OK


def _dataset_codes(args: argparse.Namespace) -> int:
    """(Re)build the code arrays of a dataset version."""
    from safeaccess.server.datasets import build_codes

    data = _data(args)
    store = _store(data)
    try:
        target = build_codes(data, store, args.name, args.version)
    finally:
        store.close()
    print(f"dataset {args.name}: code arrays written to {target.relative_to(data.root)}")
    return EXIT_OK


def _dataset_list(args: argparse.Namespace) -> int:
    store = _store(_data(args))
    try:
        rows = catalogue.all_datasets(store)
    finally:
        store.close()
    for row in rows:
        rules = row.rules_path or "default rules"
        print(f"{row.name}@{row.version}  project={row.project}  rows={row.rows}  {rules}")
    return EXIT_OK


def _dataset_dp(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from safeaccess.server.config import DPConfig

    try:
        config = DPConfig(
            epsilon=args.epsilon,
            delta=args.delta,
            scope=args.scope,
            mandatory=args.mandatory,
            max_tpr_at_5pct=args.max_tpr_at_5pct,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid DP configuration: {problems}") from exc
    store = _store(_data(args))
    try:
        store.set_dp_config(args.name, config.model_dump(mode="json"))
    finally:
        store.close()
    limit = (
        f", TPR at FPR 0.05 at most {config.max_tpr_at_5pct:g}"
        if config.max_tpr_at_5pct is not None
        else ""
    )
    print(
        f"dataset {args.name}: differential privacy with a budget of epsilon={config.epsilon:g} "
        f"at delta={config.delta:g} per {config.scope}"
        f"{' (mandatory: rule-checked kinds refused)' if config.mandatory else ''}{limit}"
    )
    return EXIT_OK


def _dataset_mock(args: argparse.Namespace) -> int:
    """Generate (and publish) the DP mock of a dataset; print the full check report."""
    import json

    from safeaccess.rules.dp import gaussian_mu_for
    from safeaccess.rules.ruleset import DEFAULT_RULESET, load_ruleset
    from safeaccess.sandbox.factory import make_backend
    from safeaccess.server.dataset_rules import current_rules_path
    from safeaccess.server.synth.mock import DEFAULT_MU, make_mock

    if (args.epsilon is None) != (args.delta is None):
        raise ConfigError("--epsilon and --delta go together; or give --mu")
    if args.epsilon is not None and args.mu is not None:
        raise ConfigError("give either --epsilon and --delta, or --mu")
    mu = gaussian_mu_for(args.epsilon, args.delta) if args.epsilon is not None else args.mu
    data = _data(args)
    config = data.load_config()
    store = _store(data)
    backend = make_backend(config.sandbox, concurrency=1)
    try:
        row = store.find_dataset(args.name)
        rules_path = current_rules_path(store, row.id) if row is not None else None
        ruleset = (
            load_ruleset(data.root / rules_path, base=DEFAULT_RULESET)
            if rules_path is not None
            else DEFAULT_RULESET
        )
        result = make_mock(
            data,
            store,
            backend,
            data.load_signing_key(),
            ruleset,
            config.sandbox.limits,
            args.name,
            mu=mu if mu is not None else DEFAULT_MU,
            rows=args.rows,
            publish=args.publish,
        )
    finally:
        backend.close()
        store.close()
    m = result.manifest
    print(
        f"mock of {m['dataset']}@{m['version']}: {m['rows']} rows, mu {m['mu']:.6g} "
        f"(epsilon {m['epsilon']:.4g} at delta {m['delta']:g}), sha256 {m['sha256']}"
    )
    print(f"tree: {', '.join('-'.join(e) for e in m['tree'])}")
    print(f"public ledger: mu^2 {result.public_before:.6g} -> {result.public_after:.6g}")
    print(f"check verdict: {result.verdict}")
    for outcome in result.check.get("outcomes", []):
        print(f"  {outcome.get('action')}: {outcome.get('rule')}: {outcome.get('detail')}")
    print(json.dumps(result.check.get("checks", {}), indent=1, sort_keys=True)[:20000])
    if result.published:
        print("published in the catalogue")
    elif args.publish:
        print("NOT published: the checks did not pass")
        return 1
    return EXIT_OK


def _dataset_budget(args: argparse.Namespace) -> int:
    from safeaccess.rules.dp import GaussianLedger
    from safeaccess.server.config import DPConfig

    store = _store(_data(args))
    try:
        raw = store.get_dp_config(args.name)
        charged = ledgers.dp_ledgers(store, args.name)
    finally:
        store.close()
    if raw is None:
        raise ConfigError(f"dataset {args.name!r} has no DP configuration ('dataset dp' sets one)")
    config = DPConfig.model_validate(raw)
    print(
        f"{args.name}: epsilon={config.epsilon:g} at delta={config.delta:g} per {config.scope}"
        f"{', mandatory' if config.mandatory else ''}"
    )
    if not charged:
        print("  nothing spent yet")
    for row in charged:
        ledger = GaussianLedger(spent=row.spent, releases=row.releases)
        print(
            f"  {row.scope} {row.owner}: {row.releases} releases, "
            f"epsilon spent {ledger.epsilon_at(config.delta):.6g}, "
            f"sum (Delta/sigma)^2 = {row.spent:.6g}"
        )
    return EXIT_OK


def _known_kinds() -> frozenset[str]:
    from typing import get_args

    from safeaccess.client.analyses import Analysis

    union = get_args(Analysis)[0]
    return frozenset(str(m.model_fields["kind"].default) for m in get_args(union))


def _dataset_claims(args: argparse.Namespace) -> int:
    from safeaccess.server.steps import claims as claim_gate

    store = _store(_data(args))
    try:
        if args.kind is not None or args.claim is not None:
            if args.kind is None or args.claim is None:
                raise ConfigError("give both --kind and --claim, or neither to list")
            if args.kind not in _known_kinds():
                raise ConfigError(
                    f"unknown analysis kind {args.kind!r}; known: "
                    f"{', '.join(sorted(_known_kinds()))}"
                )
            change = claim_gate.drop_claim if args.drop else claim_gate.require_claim
            changed = change(store, args.name, args.kind, args.claim)
            verb = "no longer requires" if args.drop else "requires"
            note = "" if changed else " (unchanged)"
            print(f"dataset {args.name}: {args.kind} {verb} claim {args.claim!r}{note}")
        reqs = claim_gate.requirements(store, args.name)
    finally:
        store.close()
    if not reqs:
        print(f"dataset {args.name}: no claims required")
    for kind, claims in sorted(reqs.items()):
        print(f"  {kind}: {', '.join(sorted(claims))}")
    return EXIT_OK


def _review_list(args: argparse.Namespace) -> int:
    from safeaccess.server.review.decisions import pending

    store = _store(_data(args))
    try:
        items = pending(store)
    finally:
        store.close()
    if not items:
        print("no steps wait for review")
    for item in items:
        print(
            f"{item.sequence_id} step {item.index}: {item.kind} by {item.researcher} "
            f"({item.project}), waiting since {item.waiting_since}"
        )
        if item.run is not None:
            print(f"    script run: {item.run}")
        for finding in item.findings:
            print(f"    {finding}")
    return EXIT_OK


def _review_openings(args: argparse.Namespace) -> int:
    from safeaccess.server.review.decisions import openings

    store = _store(_data(args))
    try:
        items = openings(store)
    finally:
        store.close()
    if not items:
        print("no sequences wait for approval to open")
    for item in items:
        budget = item.budget or {}
        print(
            f"{item.sequence_id}: {item.researcher} ({item.project}) on {item.dataset}, waiting "
            f"since {item.waiting_since}; withholds {budget.get('used')} of "
            f"{budget.get('count')} in {budget.get('days')} days, "
            f"{budget.get('open_sequences')} other sequence(s) then open"
        )
    return EXIT_OK


def _authenticated_checker(store: Store, name: str, args: argparse.Namespace) -> str:
    """The enrolled, active checker `name`, after her password and a fresh TOTP code (from
    `--credentials-fd`, the environment or the terminal: `checker_credentials`, never from the
    command line); refuses anyone else. A name alone decides nothing: the two-person rule needs
    two people, not two names."""
    from safeaccess.server.admin.checker_credentials import checker_credentials
    from safeaccess.server.web.accounts import authenticate

    given = checker_credentials(name, f"review {args.review_command}", args.credentials_fd)
    checker = authenticate(store, name, given.password, given.code)
    if checker is None:
        raise Forbidden(
            f"{name!r} is not an enrolled, active checker, or the password or code is wrong; "
            "nothing was decided (checkers are added with `safeaccess-server checker add` and "
            "enrol by their link)"
        )
    return checker


def _review_opening_decide(args: argparse.Namespace) -> int:
    from safeaccess.server.review.decisions import decide_opening

    approve = args.review_command == "approve-opening"
    store = _store(_data(args))
    try:
        reviewer = _authenticated_checker(store, args.reviewer or getpass.getuser(), args)
        state = decide_opening(
            store,
            args.sequence,
            approve=approve,
            reviewer=reviewer,
            note=args.note,
        )
    finally:
        store.close()
    verb = "approved: its step 1 runs when the researcher runs it again" if approve else "rejected"
    print(f"opening of {args.sequence} {verb}; the sequence is now {state}")
    return EXIT_OK


def _review_show(args: argparse.Namespace) -> int:
    import json

    from safeaccess.client.results import StepResult, format_output
    from safeaccess.rules.decision import Decision

    store = _store(_data(args))
    try:
        seq = store.get_sequence(args.sequence)
        step = store.get_step(args.sequence, args.step)
    finally:
        store.close()
    if seq is None or step is None:
        raise ConfigError(f"step {args.step} of sequence {args.sequence} does not exist")
    print(f"sequence {seq.id} step {step.index} by {seq.researcher} ({seq.project}): {step.state}")
    print("analysis:", step.body.decode("utf-8", "replace"))
    if step.kind == "script":
        from safeaccess.server.review.decisions import script_run_state

        print(
            "script run:",
            script_run_state(step.output, step.error_code, step.error_message, step.wall_seconds),
        )
        if step.output is not None:
            print("script stdout:")
            print(step.output.get("stdout", ""))
    if step.decision:
        decision = Decision.model_validate(step.decision)
        print(f"rules {decision.ruleset} ({decision.ruleset_hash[:12]}): {decision.verdict}")
        for f in decision.findings:
            print(f"  {f.check} ({f.verdict}){' [' + f.item + ']' if f.item else ''}: {f.message}")
    if step.public_output is not None:
        # Shown exactly as the researcher would receive it if released.
        view = {
            "sequence_id": seq.id,
            "index": step.index,
            "state": "released",
            "last": step.last,
            "output": step.public_output,
        }
        print("output:")
        print(format_output(StepResult.from_json(view)) or json.dumps(step.public_output))
    return EXIT_OK


def _review_decide(args: argparse.Namespace) -> int:
    from safeaccess.server.review.decisions import decide

    approve = args.review_command == "approve"
    store = _store(_data(args))
    try:
        reviewer = _authenticated_checker(store, args.reviewer or getpass.getuser(), args)
        state = decide(
            store,
            args.sequence,
            args.step,
            approve=approve,
            reviewer=reviewer,
            note=args.note,
        )
    finally:
        store.close()
    if approve and state == "review":
        print(
            f"step {args.step} of {args.sequence}: your approval is recorded; the dataset needs "
            "a second, different checker to approve it"
        )
        return EXIT_OK
    verb = "released" if approve else "withheld"
    print(f"step {args.step} of {args.sequence} {verb}; the sequence is now {state}")
    return EXIT_OK


def _checker_add(args: argparse.Namespace) -> int:
    from safeaccess.server.web.accounts import add_checker

    store = _store(_data(args))
    try:
        enrolment = add_checker(store, args.name, researcher=args.researcher)
    finally:
        store.close()
    base = args.base_url.rstrip("/")
    print(f"checker {args.name} added (pending until enrolled)")
    print(f"one-time enrolment link (valid until {enrolment.expires_at:%Y-%m-%d %H:%M} UTC):")
    print(f"  {base}/review/enrol?token={enrolment.token}")
    return EXIT_OK


def _checker_list(args: argparse.Namespace) -> int:
    from safeaccess.server.web.accounts import list_checkers

    store = _store(_data(args))
    try:
        checkers = list_checkers(store)
    finally:
        store.close()
    if not checkers:
        print("no checkers")
    for c in checkers:
        linked = f"  linked to researcher {c.researcher}" if c.researcher else ""
        print(f"{c.name}  {c.state}  since {c.created_at:%Y-%m-%d}{linked}")
    return EXIT_OK


def _checker_disable(args: argparse.Namespace) -> int:
    from safeaccess.server.web.accounts import disable_checker

    store = _store(_data(args))
    try:
        disable_checker(store, args.name)
    finally:
        store.close()
    print(f"checker {args.name} disabled (a running session ends at its next request)")
    return EXIT_OK


def _dataset_checkers(args: argparse.Namespace) -> int:
    from safeaccess.server.review.rules import checkers_required, set_checkers_required

    store = _store(_data(args))
    try:
        if args.count is not None:
            set_checkers_required(store, args.name, args.count, actor="admin")
        count = checkers_required(store, args.name)
    finally:
        store.close()
    rule = "two different checkers" if count == 2 else "one checker"
    print(f"dataset {args.name}: a release from review needs {rule}")
    return EXIT_OK


def _log_to_stderr(args: argparse.Namespace) -> None:
    """The server's own log (authentication failure causes, step outcomes), procrastinate's and
    uvicorn's to standard error, as text or JSON lines (`logs.py`)."""
    from safeaccess.server import logs

    logs.configure(args.log_format, args.log_level)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from safeaccess.server import shutdown
    from safeaccess.server.steps.orphans import StartupResume

    class _StoppingServer(uvicorn.Server):
        """uvicorn, whose stop signal also interrupts running admissions and arms the
        watchdog that ends the process within `shutdown.GRACE_SECONDS` (`shutdown.py`)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            shutdown.begin()
            super().handle_exit(sig, frame)

    from safeaccess.server.heap import freeze_startup_objects
    from safeaccess.server.http.app import create_app
    from safeaccess.server.readiness import sandbox_mode
    from safeaccess.server.service import Service

    _log_to_stderr(args)
    service = Service(_data(args).root)
    print(
        f"safeaccess server {service.server_id} on http://{args.host}:{args.port} "
        f"(sandbox: {service.backend.name}, mode {sandbox_mode(service.backend)})",
        flush=True,
    )
    try:
        app = create_app(service)
        freeze_startup_objects()
        if service.orphans is None and service.config.execution == "local":
            # one server owns this database (SQLite): the steps its last run left running
            # (stopped or crashed mid-step) are run again now (PostgreSQL: the orphan sweeper)
            StartupResume(service.flow)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            # None: uvicorn keeps the handlers `_log_to_stderr` set (text or JSON)
            log_config=None,
            # requests still running this long after SIGTERM are cancelled
            timeout_graceful_shutdown=int(shutdown.GRACE_SECONDS // 2),
        )
        _StoppingServer(config).run()
    finally:
        service.close()
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    from safeaccess.server.jobs.worker import WorkerOptions, run_worker

    _log_to_stderr(args)
    queues = tuple(q.strip() for q in args.queues.split(",") if q.strip())
    if not queues:
        raise ConfigError("--queues needs at least one queue, e.g. steps,scripts")
    run_worker(
        _data(args).root,
        WorkerOptions(
            slots=args.slots,
            script_slots=args.script_slots,
            backend=args.backend,
            queues=queues,
            name=args.name,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        ),
    )
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from safeaccess.server.demo.run import run_demo

    return run_demo(args.data_dir, rows=args.rows)


#: One subcommand group's action parsers (what `add_parser(...).add_subparsers()` returns).
Group = argparse._SubParsersAction


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand, one `_add_*_commands` per group."""
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
    _add_init_command(sub, common)
    project, researcher, auditor = _add_account_commands(sub, common)
    dataset = _add_dataset_commands(sub, common)
    checker = _add_checker_commands(sub, common)
    _add_review_commands(sub, common)
    _add_serving_commands(sub, common)
    # The docker engineer's `sandbox build-image` / `sandbox check` commands.
    cli_sandbox.register(sub)
    # db current / db upgrade: the schema's migrations.
    admin_db.register(sub, common)
    # queue status / failed / retry / fail: the job queue.
    admin_queue.register(sub, common)
    # key show; list/remove of accounts and projects; dataset rules.
    cli_admin.register(
        sub,
        common,
        researcher=researcher,
        auditor=auditor,
        project=project,
        checker=checker,
        dataset=dataset,
    )
    return parser


def _add_init_command(sub: Group, common: argparse.ArgumentParser) -> None:
    """init: create a data directory."""
    init = sub.add_parser("init", parents=[common], help="create a data directory")
    init.add_argument("--server-id", default=None, help="this centre's id (default: random)")
    init.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL of the database, e.g. postgresql+psycopg://user@host/safeaccess "
        "(default: SQLite in the data directory)",
    )
    init.set_defaults(handler=_init)


def _add_log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="standard error's log lines: text, or JSON lines with request, sequence and step "
        "ids (default text)",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="the least severe level logged (debug adds a failed job's traceback)",
    )


def _add_serving_commands(sub: Group, common: argparse.ArgumentParser) -> None:
    """serve, demo."""
    serve = sub.add_parser("serve", parents=[common], help="serve the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    _add_log_options(serve)
    serve.set_defaults(handler=_serve)

    worker = sub.add_parser(
        "worker",
        parents=[common],
        help="run steps from the job queue (execution: queue; connects out to PostgreSQL only)",
    )
    worker.add_argument("--slots", type=int, default=2, help="interactive steps at once")
    worker.add_argument("--script-slots", type=int, default=1, help="script runs at once")
    worker.add_argument(
        "--backend",
        choices=["process", "docker"],
        default=None,
        help="sandbox backend (default: the configured one)",
    )
    worker.add_argument(
        "--queues",
        default="steps,scripts",
        help="queues to serve: steps, steps.<pool>, scripts (comma-separated)",
    )
    worker.add_argument("--name", default=None, help="this worker's name in logs (default: host)")
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (/metrics; default: none)",
    )
    worker.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address of the metrics port (default 127.0.0.1; the private network's to scrape "
        "from another host)",
    )
    _add_log_options(worker)
    worker.set_defaults(handler=_worker)

    demo = sub.add_parser(
        "demo", parents=[common], help="run the end-to-end demo on an embedded server"
    )
    demo.add_argument("--rows", type=int, default=20_000, help="people in the generated census")
    demo.set_defaults(handler=_demo)


def _add_public_key_argument(parser: argparse.ArgumentParser) -> None:
    """`--public-key` (and `--key`, the spelling `auditor add` took first) on `researcher add`
    and `auditor add` alike."""
    parser.add_argument(
        "--public-key",
        "--key",
        dest="public_key",
        type=Path,
        required=True,
        help="her Ed25519 public key PEM (also --key)",
    )


def _add_account_commands(
    sub: Group, common: argparse.ArgumentParser
) -> tuple[Group, Group, Group]:
    """project, researcher, auditor; returns their groups (the admin commands add to them)."""
    project = sub.add_parser("project", help="projects").add_subparsers(
        dest="project_command", required=True, metavar="ACTION"
    )
    padd = project.add_parser("add", parents=[common], help="add a project")
    padd.add_argument("name", metavar="NAME")
    padd.set_defaults(handler=_project_add)

    researcher = sub.add_parser("researcher", help="researchers").add_subparsers(
        dest="researcher_command", required=True, metavar="ACTION"
    )
    radd = researcher.add_parser(
        "add", parents=[common], help="register a researcher's public key in projects"
    )
    radd.add_argument("name", metavar="NAME")
    _add_public_key_argument(radd)
    radd.add_argument(
        "--project", action="append", required=True, help="project she belongs to (repeatable)"
    )
    radd.set_defaults(handler=_researcher_add)
    rrot = researcher.add_parser(
        "rotate-key",
        parents=[common],
        help="replace her key by one she authorised with her old key's signature",
    )
    rrot.add_argument("name", metavar="NAME")
    rrot.add_argument("--public-key", type=Path, required=True, help="her new public key PEM")
    rrot.add_argument(
        "--signature",
        required=True,
        help="her old key's signature, from `safeaccess keys sign-rotation` (base64)",
    )
    rrot.set_defaults(handler=_researcher_rotate_key)
    rrev = researcher.add_parser(
        "revoke-key",
        parents=[common],
        help="the centre replaces her key without her signature (logged; her client flags it)",
    )
    rrev.add_argument("name", metavar="NAME")
    rrev.add_argument("--public-key", type=Path, required=True, help="the new public key PEM")
    rrev.add_argument("--reason", required=True, help="why (logged; she and auditors see it)")
    rrev.set_defaults(handler=_researcher_revoke_key)

    auditor = sub.add_parser("auditor", help="auditors").add_subparsers(
        dest="auditor_command", required=True, metavar="ACTION"
    )
    aadd = auditor.add_parser(
        "add", parents=[common], help="register an auditor's public key (audit endpoints only)"
    )
    aadd.add_argument("name", metavar="NAME")
    _add_public_key_argument(aadd)
    aadd.set_defaults(handler=_auditor_add)
    return project, researcher, auditor


def _add_dataset_commands(sub: Group, common: argparse.ArgumentParser) -> Group:
    """dataset add | codes | list | dp | mock | budget | claim | checkers."""
    dataset = sub.add_parser("dataset", help="datasets").add_subparsers(
        dest="dataset_command", required=True, metavar="ACTION"
    )
    dadd = dataset.add_parser(
        "add", parents=[common], help="register a new immutable dataset version"
    )
    dadd.add_argument("name", metavar="NAME")
    dadd.add_argument("--data", type=Path, required=True, help="CSV or Parquet file")
    dadd.add_argument("--metadata", type=Path, required=True, help="metadata (JSON or YAML)")
    dadd.add_argument(
        "--project", default=None, help="project the dataset belongs to (default: the only one)"
    )
    dadd.add_argument("--rules", type=Path, default=None, help="rule-set overrides (YAML)")
    dadd.add_argument(
        "--qss-mode",
        choices=("span", "atoms"),
        default=None,
        help="query-set auditing across releases: span (default) or the stricter atoms",
    )
    dadd.add_argument(
        "--qss-scope",
        choices=("researcher", "project", "dataset"),
        default=None,
        help="whose releases are audited together (default project; fixed by the first version)",
    )
    dadd.add_argument(
        "--qss-atom-cap",
        type=int,
        default=None,
        help="refuse, for cost and by that name, an output that would make more atoms "
        "(default 2000000)",
    )
    dadd.set_defaults(handler=_dataset_add)
    dcodes = dataset.add_parser(
        "codes",
        parents=[common],
        help="(re)build the integer code arrays the sandbox counts tables on",
    )
    dcodes.add_argument("name", metavar="NAME")
    dcodes.add_argument("--version", type=int, default=None, help="version (default: newest)")
    dcodes.set_defaults(handler=_dataset_codes)
    dlist = dataset.add_parser("list", parents=[common], help="list dataset versions")
    dlist.set_defaults(handler=_dataset_list)
    ddp = dataset.add_parser(
        "dp",
        parents=[common],
        help="enable or change differential privacy on a dataset (all its versions)",
    )
    ddp.add_argument("name", metavar="NAME")
    ddp.add_argument("--epsilon", type=float, required=True, help="total epsilon of one ledger")
    ddp.add_argument("--delta", type=float, required=True, help="delta the budget is stated at")
    ddp.add_argument(
        "--scope",
        choices=["researcher", "project", "dataset"],
        default="researcher",
        help="whose releases share one ledger (default: each researcher)",
    )
    ddp.add_argument(
        "--mandatory", action="store_true", help="refuse rule-checked kinds on this dataset"
    )
    ddp.add_argument(
        "--max-tpr-at-5pct",
        type=float,
        default=None,
        help="withhold a release letting an attacker reach more than this TPR at FPR 0.05",
    )
    ddp.set_defaults(handler=_dataset_dp)
    dmock = dataset.add_parser(
        "mock",
        parents=[common],
        help="generate a DP synthetic mock of a dataset (charged to its public ledger); "
        "publish it in the catalogue with --publish after the checks pass",
    )
    dmock.add_argument("name", metavar="NAME")
    dmock.add_argument(
        "--epsilon", type=float, default=None, help="with --delta: the mock's privacy"
    )
    dmock.add_argument("--delta", type=float, default=None)
    dmock.add_argument("--mu", type=float, default=None, help="GDP mu of the mock (default 0.2)")
    dmock.add_argument("--rows", type=int, default=1000, help="synthetic rows (1..10000)")
    dmock.add_argument("--publish", action="store_true", help="publish it if the checks pass")
    dmock.set_defaults(handler=_dataset_mock)
    dbudget = dataset.add_parser(
        "budget", parents=[common], help="a DP dataset's configuration and what each ledger spent"
    )
    dbudget.add_argument("name", metavar="NAME")
    dbudget.set_defaults(handler=_dataset_budget)

    dclaim = dataset.add_parser(
        "require-claim",
        parents=[common],
        help="require a trusted CA's claim (e.g. fair) for an analysis kind on a dataset; "
        "without --kind/--claim, list what is required",
    )
    dclaim.add_argument("name", metavar="NAME")
    dclaim.add_argument("--kind", default=None, help="analysis kind, e.g. model_training")
    dclaim.add_argument(
        "--claim", default=None, help="the claim (policy name) an endorsement must carry"
    )
    dclaim.add_argument("--drop", action="store_true", help="stop requiring it")
    dclaim.set_defaults(handler=_dataset_claims)

    dcheckers = dataset.add_parser(
        "checkers",
        parents=[common],
        help="show or set how many different output checkers must approve a release (1 or 2)",
    )
    dcheckers.add_argument("name", metavar="NAME")
    dcheckers.add_argument("count", metavar="COUNT", type=int, nargs="?", default=None)
    dcheckers.set_defaults(handler=_dataset_checkers)
    return dataset


def _add_checker_commands(sub: Group, common: argparse.ArgumentParser) -> Group:
    """checker add | list | disable: the output checkers' web accounts."""
    checker = sub.add_parser("checker", help="output checkers' web accounts").add_subparsers(
        dest="checker_command", required=True, metavar="ACTION"
    )
    cadd = checker.add_parser(
        "add", parents=[common], help="add a checker and print her one-time enrolment link"
    )
    cadd.add_argument("name", metavar="NAME")
    cadd.add_argument(
        "--researcher",
        default=None,
        help="researcher identity this person also holds (she can never review its outputs)",
    )
    cadd.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="the server's address as checkers reach it (for the link)",
    )
    cadd.set_defaults(handler=_checker_add)
    clist = checker.add_parser("list", parents=[common], help="list checkers")
    clist.set_defaults(handler=_checker_list)
    cdis = checker.add_parser("disable", parents=[common], help="disable a checker's account")
    cdis.add_argument("name", metavar="NAME")
    cdis.set_defaults(handler=_checker_disable)
    return checker


def _add_credentials_fd(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--credentials-fd",
        type=int,
        default=None,
        metavar="N",
        help="read your password and TOTP code from file descriptor N, one per line (without a "
        "terminal; or set SAFEACCESS_CHECKER_PASSWORD and SAFEACCESS_CHECKER_CODE)",
    )


def _add_review_commands(sub: Group, common: argparse.ArgumentParser) -> None:
    """review list | show | approve | reject | opening decisions: the output checkers' queue."""
    review = sub.add_parser("review", help="the output checkers' queue").add_subparsers(
        dest="review_command", required=True, metavar="ACTION"
    )
    rlist = review.add_parser("list", parents=[common], help="steps waiting for review")
    rlist.set_defaults(handler=_review_list)
    rshow = review.add_parser(
        "show", parents=[common], help="a step's analysis, findings and output, as released"
    )
    rshow.add_argument("sequence", metavar="SEQUENCE_ID")
    rshow.add_argument("step", metavar="STEP", type=int)
    rshow.set_defaults(handler=_review_show)
    for action, text in (
        ("approve", "release the step"),
        ("reject", "withhold the step (aborts the sequence)"),
    ):
        decide = review.add_parser(action, parents=[common], help=text)
        decide.add_argument("sequence", metavar="SEQUENCE_ID")
        decide.add_argument("step", metavar="STEP", type=int)
        decide.add_argument(
            "--reviewer",
            default=None,
            help="your checker name (default: login name); your password and TOTP code are asked",
        )
        _add_credentials_fd(decide)
        decide.add_argument(
            "--note",
            default="",
            help="message to the researcher (she sees it with the decision; its hash is logged)",
        )
        decide.set_defaults(handler=_review_decide)
    ropen = review.add_parser(
        "openings", parents=[common], help="sequences past a withhold budget awaiting approval"
    )
    ropen.set_defaults(handler=_review_openings)
    for action, text in (
        ("approve-opening", "let a sequence past the withhold budget run"),
        ("reject-opening", "refuse a sequence past the withhold budget (aborts it)"),
    ):
        decide = review.add_parser(action, parents=[common], help=text)
        decide.add_argument("sequence", metavar="SEQUENCE_ID")
        decide.add_argument(
            "--reviewer",
            default=None,
            help="your checker name (default: login name); your password and TOTP code are asked",
        )
        _add_credentials_fd(decide)
        decide.add_argument(
            "--note",
            default="",
            help="message to the researcher (she sees it with the decision; its hash is logged)",
        )
        decide.set_defaults(handler=_review_opening_decide)


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
