"""`safeaccess audit verify|export|receipt`: the auditor's and the researcher's log checks."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from safeaccess.client.keys import load_public_key

EXIT_OK = 0
EXIT_BAD_LOG = 1


class CommandError(Exception):
    pass


def _progress(done: int, total: int) -> None:
    print(f"  ... {done}/{total} entries read", file=sys.stderr, flush=True)


def _verify(args: argparse.Namespace) -> int:
    from safeaccess.client.audit.remote import (
        AuditHTTPError,
        LogDamaged,
        ServerSource,
        SignedClient,
    )
    from safeaccess.client.audit.verify import AuditFailure, ExportSource, LogSource, verify_log

    pinned = load_public_key(args.server_key) if args.server_key is not None else None
    started = time.perf_counter()
    client = None
    source: LogSource
    try:
        if args.export is not None:
            source = ExportSource(args.export)
            if pinned is not None:
                source.server_key = pinned
            where = f"export {args.export}"
        else:
            if args.key is None or args.auditor is None:
                raise CommandError("--server needs --key (your private key) and --auditor NAME")
            client = SignedClient(args.server, args.key, args.auditor, ca_bundle=args.ca_bundle)
            source = ServerSource(client, pinned)
            where = f"server {args.server}"
        print(f"verifying the audit log of {source.server_id} ({where})")
        if pinned is None:
            print(
                "  note: the centre's key was taken from the log source itself; pin it with "
                "--server-key to rule out a substituted key"
            )
        report = verify_log(source, trusted=args.trusted_checkpoint, progress=_progress)
    except AuditFailure as exc:
        print(f"FAILED: {exc}")
        return EXIT_BAD_LOG
    except LogDamaged as exc:
        print(f"FAILED: entry {exc.entry}: {exc} (the server could not sign a checkpoint)")
        return EXIT_BAD_LOG
    except AuditHTTPError as exc:
        raise CommandError(str(exc)) from exc
    finally:
        if client is not None:
            client.close()
    for line in report.lines():
        print("  " + line)
    if args.save_checkpoint is not None:
        args.save_checkpoint.write_text(report.checkpoint, encoding="utf-8")
        print(
            f"  checkpoint saved to {args.save_checkpoint}: pass it as --trusted-checkpoint "
            "next time"
        )
    print(f"OK: the log verifies ({time.perf_counter() - started:.1f} s)")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from safeaccess.client.audit.remote import ServerSource, SignedClient

    client = SignedClient(args.server, args.key, args.auditor, ca_bundle=args.ca_bundle)
    try:
        ServerSource(client).export(args.out)
    finally:
        client.close()
    print(f"exported the audit log to {args.out}")
    return EXIT_OK


def _receipt(args: argparse.Namespace) -> int:
    from safeaccess.client.audit.receipt import check_receipt
    from safeaccess.client.audit.remote import SignedClient
    from safeaccess.client.audit.verify import AuditFailure

    data: dict[str, Any] = json.loads(args.receipt.read_text(encoding="utf-8"))
    receipt = data.get("receipt", data)
    output = data.get("output")
    fields = receipt.get("fields", {}) if isinstance(receipt, dict) else {}
    client = SignedClient(args.server, args.key, args.researcher, ca_bundle=args.ca_bundle)
    try:
        health = client.health()
        import base64

        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        key = (
            load_public_key(args.server_key)
            if args.server_key is not None
            else Ed25519PublicKey.from_public_bytes(base64.b64decode(health["server_public_key"]))
        )
        base = f"/v1/sequences/{fields.get('sequence')}/steps/{fields.get('step')}"
        proof = client.get(base + "/proof").json()
        served = client.get(base).json().get("output")
        result = check_receipt(receipt, output, proof, key, str(health["server_id"]), served)
    except AuditFailure as exc:
        print(f"FAILED: {exc}")
        return EXIT_BAD_LOG
    finally:
        client.close()
    print(
        f"OK: step {fields.get('step')} of sequence {fields.get('sequence')} is {result.state} "
        f"at log entry {result.entry}, included in the signed tree of {result.size} entries"
        + ("; the log commits to exactly your output" if result.output_checked else "")
    )
    return EXIT_OK


def add_audit(subparsers: Any) -> None:
    audit = subparsers.add_parser("audit", help="verify a centre's audit log or your receipt")
    sub = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")

    verify = sub.add_parser("verify", help="verify the whole log (server or export)")
    where = verify.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="server URL")
    where.add_argument("--export", type=Path, help="an export file (offline)")
    verify.add_argument("--key", type=Path, help="your private key (with --server)")
    verify.add_argument("--auditor", help="your auditor name on the server (with --server)")
    verify.add_argument("--server-key", type=Path, help="the centre's public key (PEM) to pin")
    verify.add_argument(
        "--trusted-checkpoint",
        type=Path,
        help="a checkpoint (or an earlier export) you trust: the log must extend it",
    )
    verify.add_argument("--save-checkpoint", type=Path, help="write the verified checkpoint here")
    verify.add_argument(
        "--ca-bundle", type=Path, help="PEM file of the CA that issued the centre's TLS certificate"
    )
    verify.set_defaults(handler=_verify)

    export = sub.add_parser("export", help="download the whole log for offline verification")
    export.add_argument("--server", required=True)
    export.add_argument("--key", type=Path, required=True)
    export.add_argument("--auditor", required=True)
    export.add_argument("--out", type=Path, required=True)
    export.add_argument(
        "--ca-bundle", type=Path, help="PEM file of the CA that issued the centre's TLS certificate"
    )
    export.set_defaults(handler=_export)

    receipt = sub.add_parser("receipt", help="check your step's receipt against the log")
    receipt.add_argument(
        "receipt",
        type=Path,
        metavar="RECEIPT.json",
        help="the step as received (with 'receipt' and 'output'), or a receipt",
    )
    receipt.add_argument("--server", required=True)
    receipt.add_argument("--key", type=Path, required=True, help="your private key")
    receipt.add_argument("--researcher", required=True)
    receipt.add_argument("--server-key", type=Path, help="the centre's public key (PEM) to pin")
    receipt.add_argument(
        "--ca-bundle", type=Path, help="PEM file of the CA that issued the centre's TLS certificate"
    )
    receipt.set_defaults(handler=_receipt)
