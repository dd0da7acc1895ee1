"""What the admin CLI's rows call and how they print: accounts and projects, datasets, the review
queue, the checkers' accounts and the centre's key.

Each `call` takes the command's `Centre` and arguments and returns what the command found or
did; each `show` prints it and returns the exit code (None: success). The table in `cli.py`
pairs them with each command's name and arguments; `table.run` runs any row. Bad input raises
the errors `cli.main` prints as one line.
"""

from __future__ import annotations

import argparse
import getpass
from functools import partial
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.httpsig import valid_keyid
from safeaccess.client.keys import fingerprint, load_public_key, public_key_text
from safeaccess.server.admin.table import EXIT_FAILED, Centre
from safeaccess.server.errors import ConfigError, Forbidden
from safeaccess.server.store import Store, catalogue, ledgers
from safeaccess.server.store.schema import DatasetRow, DPLedgerRow, SequenceRow, StepRow

# -- the centre's key -----------------------------------------------------------------------------


def centre_key(centre: Centre, _args: argparse.Namespace) -> tuple[str, Ed25519PublicKey]:
    """The centre's id and its public key."""
    config = centre.data.load_config()
    return config.server_id, centre.data.load_signing_key().public_key()


def show_key(_args: argparse.Namespace, key: tuple[str, Ed25519PublicKey]) -> None:
    server_id, public = key
    print(f"server id:   {server_id}")
    print(f"fingerprint: {fingerprint(public)}")
    print(public_key_text(public), end="")


# -- researchers and auditors ---------------------------------------------------------------------


def _key_of(role: str, args: argparse.Namespace) -> tuple[str, str]:
    """The PEM text and fingerprint of the key a new researcher or auditor `args.name` is
    registered with, after her name is checked (it is the key id her requests are signed with)."""
    if not valid_keyid(args.name):
        raise ConfigError(
            f"{role} name {args.name!r}: use up to 128 letters, digits and _ . @ - "
            "(it is the key id her requests are signed with)"
        )
    key = load_public_key(args.public_key)
    return public_key_text(key), fingerprint(key)


def researcher_add(centre: Centre, args: argparse.Namespace) -> str:
    pem, fpr = _key_of("researcher", args)
    centre.store.add_researcher(args.name, pem, fpr, args.project)
    return fpr


def show_researcher_added(args: argparse.Namespace, fpr: str) -> None:
    print(f"researcher {args.name} ({fpr}) in {', '.join(args.project)}")


def auditor_add(centre: Centre, args: argparse.Namespace) -> str:
    pem, fpr = _key_of("auditor", args)
    centre.store.add_auditor(args.name, pem, fpr)
    return fpr


def show_auditor_added(args: argparse.Namespace, fpr: str) -> None:
    print(f"auditor {args.name} ({fpr}): may read the audit log, nothing else")


def change_researcher_key(revoke: bool) -> Any:
    """`researcher rotate-key` (signed by her old key) or `revoke-key` (with a reason)."""

    def call(centre: Centre, args: argparse.Namespace) -> tuple[str, int]:
        key = load_public_key(args.public_key)
        config = centre.data.load_config()
        entry = catalogue.change_researcher_key(
            centre.store,
            args.name,
            public_key_text(key),
            fingerprint(key),
            server_id=config.server_id,
            signature=None if revoke else args.signature.strip(),
            reason=args.reason if revoke else None,
        )
        return fingerprint(key), entry

    return call


def show_key_changed(revoke: bool) -> Any:
    verb = "revoked (her client flags it at her next connection)" if revoke else "rotated"

    def show(args: argparse.Namespace, changed: tuple[str, int]) -> None:
        fpr, entry = changed
        print(f"researcher {args.name}: key {verb}; now {fpr} (audit log entry {entry})")

    return show


def show_researcher_removed(args: argparse.Namespace, removed: list[str]) -> None:
    if args.project:
        print(f"researcher {args.name} removed from {', '.join(removed)}")
    else:
        print(f"researcher {args.name} removed (was in {', '.join(removed) or 'no project'})")


# -- datasets -------------------------------------------------------------------------------------


def _qss_settings(args: argparse.Namespace, store: Store) -> Any:
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


def dataset_add(centre: Centre, args: argparse.Namespace) -> DatasetRow:
    from safeaccess.server.datasets import load_metadata, read_table, register_dataset

    store = centre.store
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
    return register_dataset(
        centre.data,
        store,
        name=args.name,
        frame=None if streamed else read_table(args.data),
        source=args.data if streamed else None,
        metadata=metadata,
        project=project,
        rules_file=args.rules,
        qss=_qss_settings(args, store),
    )


def show_dataset_added(args: argparse.Namespace, row: DatasetRow) -> None:
    from safeaccess.server.datasets import missing_markers

    print(f"dataset {row.name} version {row.version}: {row.rows} rows, sha256 {row.sha256}")
    markers = missing_markers(args.data)
    if markers:
        print("read as missing values (pandas' NA markers; check none of them is a real value):")
        for note in markers:
            print(f"  {note}")


def dataset_codes(centre: Centre, args: argparse.Namespace) -> str:
    """(Re)build the code arrays of a dataset version; where they are, in the data directory."""
    from safeaccess.server.datasets import build_codes

    target = build_codes(centre.data, centre.store, args.name, args.version)
    return str(target.relative_to(centre.data.root))


def dataset_line(row: DatasetRow) -> str:
    rules = row.rules_path or "default rules"
    return f"{row.name}@{row.version}  project={row.project}  rows={row.rows}  {rules}"


def dataset_dp(centre: Centre, args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from safeaccess.server.config import DPConfig

    try:
        # Each field from the option of the same name (--max-tpr-at-5pct: max_tpr_at_5pct).
        config = DPConfig.model_validate(args, from_attributes=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid DP configuration: {problems}") from exc
    centre.store.set_dp_config(args.name, config.model_dump(mode="json"))
    return config


def show_dp(args: argparse.Namespace, config: Any) -> None:
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


def dataset_mock(centre: Centre, args: argparse.Namespace) -> Any:
    """Generate (and publish) the DP mock of a dataset."""
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
    data = centre.data
    config = data.load_config()
    store = centre.store
    backend = make_backend(config.sandbox, concurrency=1)
    try:
        row = store.find_dataset(args.name)
        rules_path = current_rules_path(store, row.id) if row is not None else None
        ruleset = (
            load_ruleset(data.root / rules_path, base=DEFAULT_RULESET)
            if rules_path is not None
            else DEFAULT_RULESET
        )
        return make_mock(
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


def show_mock(args: argparse.Namespace, result: Any) -> int | None:
    """The mock and its full check report; failure if asked to publish a mock that failed."""
    import json

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
        return EXIT_FAILED
    return None


def dataset_budget(
    centre: Centre, args: argparse.Namespace
) -> tuple[dict[str, Any], list[DPLedgerRow]]:
    raw = centre.store.get_dp_config(args.name)
    charged = ledgers.dp_ledgers(centre.store, args.name)
    if raw is None:
        raise ConfigError(f"dataset {args.name!r} has no DP configuration ('dataset dp' sets one)")
    return raw, charged


def show_budget(args: argparse.Namespace, budget: tuple[dict[str, Any], list[DPLedgerRow]]) -> None:
    from safeaccess.rules.dp import GaussianLedger
    from safeaccess.server.config import DPConfig

    raw, charged = budget
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


def _known_kinds() -> frozenset[str]:
    from typing import get_args

    from safeaccess.client.analyses import Analysis

    union = get_args(Analysis)[0]
    return frozenset(str(m.model_fields["kind"].default) for m in get_args(union))


def dataset_claims(
    centre: Centre, args: argparse.Namespace
) -> tuple[bool | None, dict[str, frozenset[str]]]:
    """Require or drop a claim (with --kind and --claim), then what the dataset requires;
    whether the change changed anything (None: nothing was asked)."""
    from safeaccess.server.steps import claims as claim_gate

    changed = None
    if args.kind is not None or args.claim is not None:
        if args.kind is None or args.claim is None:
            raise ConfigError("give both --kind and --claim, or neither to list")
        if args.kind not in _known_kinds():
            raise ConfigError(
                f"unknown analysis kind {args.kind!r}; known: {', '.join(sorted(_known_kinds()))}"
            )
        change = claim_gate.drop_claim if args.drop else claim_gate.require_claim
        changed = change(centre.store, args.name, args.kind, args.claim)
    return changed, claim_gate.requirements(centre.store, args.name)


def show_claims(
    args: argparse.Namespace, claims: tuple[bool | None, dict[str, frozenset[str]]]
) -> None:
    changed, required = claims
    if changed is not None:
        verb = "no longer requires" if args.drop else "requires"
        note = "" if changed else " (unchanged)"
        print(f"dataset {args.name}: {args.kind} {verb} claim {args.claim!r}{note}")
    if not required:
        print(f"dataset {args.name}: no claims required")
    for kind, names in sorted(required.items()):
        print(f"  {kind}: {', '.join(sorted(names))}")


def dataset_checkers(centre: Centre, args: argparse.Namespace) -> int:
    from safeaccess.server.review.rules import checkers_required, set_checkers_required

    if args.count is not None:
        set_checkers_required(centre.store, args.name, args.count, actor="admin")
    return checkers_required(centre.store, args.name)


def show_checkers(args: argparse.Namespace, count: int) -> None:
    rule = "two different checkers" if count == 2 else "one checker"
    print(f"dataset {args.name}: a release from review needs {rule}")


def dataset_rules(centre: Centre, args: argparse.Namespace) -> tuple[DatasetRow, str, str]:
    from safeaccess.server.dataset_rules import set_rules

    return set_rules(centre.data, centre.store, args.name, args.file, version=args.version)


def show_rules(_args: argparse.Namespace, changed: tuple[DatasetRow, str, str]) -> None:
    row, label, digest = changed
    print(
        f"dataset {row.name}@{row.version}: rule set {label} (sha256 {digest}) from the next "
        "step on; decisions made so far name the rule set they were made with"
    )


# -- the review queue -----------------------------------------------------------------------------


def review_pending(centre: Centre, _args: argparse.Namespace) -> list[Any]:
    from safeaccess.server.review.decisions import pending

    return pending(centre.store)


def show_pending(_args: argparse.Namespace, items: list[Any]) -> None:
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


def review_openings(centre: Centre, _args: argparse.Namespace) -> list[Any]:
    from safeaccess.server.review.decisions import openings

    return openings(centre.store)


def opening_line(item: Any) -> str:
    budget = item.budget or {}
    return (
        f"{item.sequence_id}: {item.researcher} ({item.project}) on {item.dataset}, waiting "
        f"since {item.waiting_since}; withholds {budget.get('used')} of "
        f"{budget.get('count')} in {budget.get('days')} days, "
        f"{budget.get('open_sequences')} other sequence(s) then open"
    )


def _authenticated_checker(store: Store, args: argparse.Namespace) -> str:
    """The enrolled, active checker deciding (`--reviewer`, else the login name), after her
    password and a fresh TOTP code (from `--credentials-fd`, the environment or the terminal:
    `checker_credentials`, never from the command line); refuses anyone else. A name alone
    decides nothing: the two-person rule needs two people, not two names."""
    from safeaccess.server.admin.checker_credentials import checker_credentials
    from safeaccess.server.web.accounts import authenticate

    name = args.reviewer or getpass.getuser()
    given = checker_credentials(name, f"review {args.review_command}", args.credentials_fd)
    checker = authenticate(store, name, given.password, given.code)
    if checker is None:
        raise Forbidden(
            f"{name!r} is not an enrolled, active checker, or the password or code is wrong; "
            "nothing was decided (checkers are added with `safeaccess-server checker add` and "
            "enrol by their link)"
        )
    return checker


def review_decide(centre: Centre, args: argparse.Namespace) -> str:
    """`review approve | reject` of a step, or `review approve-opening | reject-opening` of a
    sequence past its withhold budget; the sequence's state after it."""
    from safeaccess.server.review.decisions import decide, decide_opening

    store = centre.store
    decision = (
        partial(decide_opening, store, args.sequence)
        if args.review_command.endswith("-opening")
        else partial(decide, store, args.sequence, args.step)
    )
    return decision(
        approve=args.review_command.startswith("approve"),
        reviewer=_authenticated_checker(store, args),
        note=args.note,
    )


def show_decided(args: argparse.Namespace, state: str) -> None:
    approve = args.review_command == "approve"
    if approve and state == "review":
        print(
            f"step {args.step} of {args.sequence}: your approval is recorded; the dataset needs "
            "a second, different checker to approve it"
        )
        return
    verb = "released" if approve else "withheld"
    print(f"step {args.step} of {args.sequence} {verb}; the sequence is now {state}")


def show_opening_decided(args: argparse.Namespace, state: str) -> None:
    approve = args.review_command == "approve-opening"
    verb = "approved: its step 1 runs when the researcher runs it again" if approve else "rejected"
    print(f"opening of {args.sequence} {verb}; the sequence is now {state}")


def review_step(centre: Centre, args: argparse.Namespace) -> tuple[SequenceRow, StepRow]:
    seq = centre.store.get_sequence(args.sequence)
    step = centre.store.get_step(args.sequence, args.step)
    if seq is None or step is None:
        raise ConfigError(f"step {args.step} of sequence {args.sequence} does not exist")
    return seq, step


def show_step(_args: argparse.Namespace, found: tuple[SequenceRow, StepRow]) -> None:
    import json

    from safeaccess.client.results import StepResult, format_output
    from safeaccess.rules.decision import Decision

    seq, step = found
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


# -- the output checkers' accounts ----------------------------------------------------------------


def show_enrolment(args: argparse.Namespace, enrolment: Any) -> None:
    base = args.base_url.rstrip("/")
    print(f"checker {args.name} added (pending until enrolled)")
    print(f"one-time enrolment link (valid until {enrolment.expires_at:%Y-%m-%d %H:%M} UTC):")
    print(f"  {base}/review/enrol?token={enrolment.token}")


def checker_line(checker: Any) -> str:
    linked = f"  linked to researcher {checker.researcher}" if checker.researcher else ""
    return f"{checker.name}  {checker.state}  since {checker.created_at:%Y-%m-%d}{linked}"


def checker_add(centre: Centre, args: argparse.Namespace) -> Any:
    from safeaccess.server.web.accounts import add_checker

    return add_checker(centre.store, args.name, researcher=args.researcher)


def checker_list(centre: Centre, _args: argparse.Namespace) -> list[Any]:
    from safeaccess.server.web.accounts import list_checkers

    return list_checkers(centre.store)


def checker_disable(centre: Centre, args: argparse.Namespace) -> None:
    from safeaccess.server.web.accounts import disable_checker

    disable_checker(centre.store, args.name)
