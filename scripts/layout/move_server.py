#!/usr/bin/env python3
"""Move the server distribution to its sub-package layout and rewrite every reference to it.

The layout (see docs/server.md): the contract modules stay at the root (`errors`, `states`,
`config`, `dp_config`, `outcome`, `digests`, `schemas`, `datasets`, `dataset_rules`, `auth`,
`ratelimit`, `service`, plus `auditors.py` and `dp.py`); `audit/` (the log and its records),
`qss/` (query-set-size admission), `steps/` (the step pipeline), `review/` (manual review),
`http/` (the JSON API), `admin/` (the command line and administration), `demo/`, and the
existing `store/`, `synth/` and `web/`.

The engine (the `git mv`s, the rewrites of dotted names, paths and `from safeaccess.server import
module`, `--check`, idempotence) is `moves.py`, shared with `move_sandbox.py`; this file holds
the server's mapping and the new packages' `__init__.py` files only.

Usage: `python scripts/layout/move_server.py [--check]` from anywhere in the repository;
`--check` lists the files it would change and exits 1 if there are any.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moves import Layout, run  # the engine, beside this script

#: Old module (dotted, below safeaccess.server) -> new module.
MODULES: dict[str, str] = {
    "audit_service": "auditors",
    "dp_release": "dp",
    "auditlog": "audit.log",
    "audit_records": "audit.records",
    "audit_facts": "audit.facts",
    "leverage_record": "audit.leverage",
    "qss_gate": "qss.gate",
    "qss_scope": "qss.scope",
    "qss_grid": "qss.grid",
    "qss_universe": "qss.universe",
    "qss_settings": "qss.settings",
    "record_ids": "qss.record_ids",
    "pipeline": "steps.pipeline",
    "receipts": "steps.receipts",
    "failures": "steps.failures",
    "reasons": "steps.reasons",
    "scheduler": "steps.scheduler",
    "withhold_budget": "steps.withhold_budget",
    "budgets": "steps.budgets",
    "rehearsal": "steps.rehearsal",
    "script_runs": "steps.scripts",
    "claim_gate": "steps.claims",
    "review": "review.decisions",
    "review_rules": "review.rules",
    "api": "http.app",
    "api_audit": "http.audit",
    "embedded": "http.embedded",
    "cli": "admin.cli",
    "cli_sandbox": "admin.sandbox",
    "cli_admin": "admin.commands",
    "admin_accounts": "admin.accounts",
    "demo": "demo.run",
    "demo_data": "demo.data",
    "demo_applicants": "demo.applicants",
}

#: Old path -> new path, below server/src/safeaccess/server (one per module above).
MOVES: dict[str, str] = {f"{old}.py": new.replace(".", "/") + ".py" for old, new in MODULES.items()}

NEW_FILES = {
    "audit/__init__.py": '"""The audit log (an RFC 9162 Merkle tree) and the records it holds."""\n',
    "review/__init__.py": '"""Manual review of withheld outputs: the decisions and their rules."""\n',
    "http/__init__.py": (
        '"""The JSON API: the application, the auditors\' endpoints, the embedded server.\n\n'
        "Named `http` inside `safeaccess.server`; the standard library's `http` is still what\n"
        "`import http` gives (imports are absolute), so nothing here may import it relatively.\n"
        '"""\n'
    ),
    "demo/__init__.py": '"""The end-to-end demo (`safeaccess-server demo`) and its made-up data."""\n',
}

#: Where references are rewritten (tracked and untracked-but-not-ignored files).
REWRITE_ROOTS = (
    "client/src",
    "rules/src",
    "sandbox/src",
    "server/src",
    "server/pyproject.toml",
    "server/README.md",
    "tests",
    "benchmarks",
    "docs",
    "scripts",
    "deploy",
    ".ci",
    "pyproject.toml",
    "README.md",
    "ARCHITECTURE.md",
)

LAYOUT = Layout(
    dist="server",
    modules=MODULES,
    moves=MOVES,
    rewrite_roots=REWRITE_ROOTS,
    new_files=NEW_FILES,
)


if __name__ == "__main__":
    raise SystemExit(run(LAYOUT, (__doc__ or "").splitlines()[0]))
