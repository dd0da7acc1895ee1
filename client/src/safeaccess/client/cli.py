"""The `safeaccess` command line.

Each subcommand group is registered by one `_add_<name>(subparsers)` function listed in
`_COMMANDS`; its handlers take the parsed arguments and return an exit code. Adding a subcommand
is writing one such function and appending it to `_COMMANDS`. Exit codes: 0 success, 2 usage or
user error (a one-line message on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from safeaccess.client.audit.cli import CommandError as AuditCommandError
from safeaccess.client.ca.policy import PolicyError
from safeaccess.client.keyrotation import sign_rotation
from safeaccess.client.keys import (
    PUBLIC_SUFFIX,
    KeyFileError,
    default_key_dir,
    fingerprint,
    generate_keypair,
    key_paths,
    load_private_key,
    load_public_key,
    public_key_text,
)
from safeaccess.client.protocol.errors import ProtocolError

EXIT_OK = 0
EXIT_USER_ERROR = 2

Handler = Callable[[argparse.Namespace], int]


class CommandError(Exception):
    """A user error a command reports as one line on stderr with exit code 2."""


# Errors that are the user's to fix: reported without a traceback.
USER_ERRORS: tuple[type[Exception], ...] = (
    CommandError,
    KeyFileError,
    ProtocolError,
    OSError,
    AuditCommandError,
    PolicyError,
)


def _print_key(name: str | None, path: Path | None, pem: str, fp: str) -> None:
    if name is not None:
        print(f"name:        {name}")
    if path is not None:
        print(f"file:        {path}")
    print(f"fingerprint: {fp}")
    print(pem, end="")


def _keys_new(args: argparse.Namespace) -> int:
    private_path, public_path = generate_keypair(args.name, args.dir)
    key = load_public_key(public_path)
    print(f"created private key {private_path} (mode 0600; keep it secret)")
    print(f"created public key  {public_path} (give this to the data controller)")
    _print_key(args.name, None, public_key_text(key), fingerprint(key))
    return EXIT_OK


def _keys_show(args: argparse.Namespace) -> int:
    if args.key is not None:
        if args.name is not None:
            raise CommandError("give either a key NAME or --key FILE, not both")
        key = load_public_key(args.key)
        _print_key(None, args.key, public_key_text(key), fingerprint(key))
        return EXIT_OK
    directory = args.dir if args.dir is not None else default_key_dir()
    if args.name is not None:
        private_path, public_path = key_paths(args.name, directory)
        path = public_path if public_path.exists() else private_path
        if not path.exists():
            raise CommandError(
                f"no key named {args.name!r} in {directory}; create one with "
                f"`safeaccess keys new {args.name}`"
            )
        names = [(args.name, path)]
    else:
        names = sorted((p.stem, p) for p in directory.glob(f"*{PUBLIC_SUFFIX}"))
        if not names:
            raise CommandError(
                f"no keys in {directory}; create one with `safeaccess keys new NAME`"
            )
    for index, (name, path) in enumerate(names):
        if index:
            print()
        key = load_public_key(path)
        _print_key(name, path, public_key_text(key), fingerprint(key))
    return EXIT_OK


def _keys_sign_rotation(args: argparse.Namespace) -> int:
    old = load_private_key(args.key)
    new = load_public_key(args.new_public_key)
    print(
        sign_rotation(old, args.server_id, args.researcher, fingerprint(old), public_key_text(new))
    )
    return EXIT_OK


def _add_keys(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = subparsers.add_parser("keys", help="create and show Ed25519 signing keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    dir_help = "key directory (default: $SAFEACCESS_HOME/keys, else ~/.safeaccess/keys)"

    new = keys_sub.add_parser("new", help="create a key pair NAME.key (0600) and NAME.pub")
    new.add_argument("name", metavar="NAME", help="key name, e.g. your user name")
    new.add_argument("--dir", type=Path, default=None, help=dir_help)
    new.set_defaults(handler=_keys_new)

    show = keys_sub.add_parser("show", help="print public keys and their fingerprints")
    show.add_argument("name", metavar="NAME", nargs="?", help="key name (default: all keys)")
    where = show.add_mutually_exclusive_group()
    where.add_argument("--dir", type=Path, default=None, help=dir_help)
    where.add_argument("--key", type=Path, default=None, help="a public or private PEM key file")
    show.set_defaults(handler=_keys_show)

    rot = keys_sub.add_parser(
        "sign-rotation",
        help="authorise replacing your key: sign the new public key with your old private key",
    )
    rot.add_argument("--key", type=Path, required=True, help="your old private key file")
    rot.add_argument("--new-public-key", type=Path, required=True, help="your new public key")
    rot.add_argument("--researcher", required=True, help="your researcher name at the centre")
    rot.add_argument("--server-id", required=True, help="the centre's server id")
    rot.set_defaults(handler=_keys_sign_rotation)


def _drive(args: argparse.Namespace, sealed_file: Path | None, sequence_id: str | None) -> int:
    """Run a sealed file (`run`) or a sequence from the journal (`resume`): print each step,
    save the results folder with --out, exit 0 when every step was released."""
    from safeaccess.client.protocol.sealed import SealedSequence
    from safeaccess.client.results import StepResult, format_output
    from safeaccess.client.results_folder import ResultsFolderError, check_folder_for
    from safeaccess.client.session import SessionError, connect

    sealed = SealedSequence.from_json(sealed_file.read_bytes()) if sealed_file else None
    if sealed is not None and args.out is not None:
        try:
            check_folder_for(sealed, args.out)
        except ResultsFolderError as exc:
            raise CommandError(str(exc)) from exc

    def show(result: StepResult) -> None:
        print(result.describe())
        if result.released:
            print(format_output(result))
        print()

    options = {
        "review_timeout": args.review_timeout,
        "on_step": show,
        # Only the lines between results: each result is printed by `show`.
        "progress": lambda line: print(line, flush=True) if line.endswith("…") else None,
    }
    server_key = load_public_key(args.server_key) if args.server_key is not None else None
    try:
        with connect(
            args.server,
            args.key,
            args.researcher,
            server_key=server_key,
            ca_bundle=args.ca_bundle,
        ) as session:
            if sealed is None:
                assert sequence_id is not None
                entry = session.journal_entry(sequence_id)
                if args.out is not None:
                    check_folder_for(entry.sealed, args.out)
                sealed = entry.sealed
            results = session.run(sealed, **options)
    except (SessionError, ResultsFolderError) as exc:
        raise CommandError(str(exc)) from exc
    if args.out is not None:
        try:
            folder = results.save(args.out)
        except ResultsFolderError as exc:
            raise CommandError(str(exc)) from exc
        print(f"results saved to {folder} (README.md lists every step)")
    final = results[-1]
    if final.released and final.last:
        print(f"sequence {final.sequence_id}: finished, all {final.index} steps released")
        return EXIT_OK
    print(f"sequence {final.sequence_id}: stopped at step {final.index} ({final.status})")
    if final.status in ("review", "pending"):
        print(f"continue later with: safeaccess resume {final.sequence_id} --server ...")
    return 1


def _run(args: argparse.Namespace) -> int:
    return _drive(args, Path(args.sealed), None)


def _resume(args: argparse.Namespace) -> int:
    return _drive(args, None, args.sequence_id)


def _sequences(args: argparse.Namespace) -> int:
    from safeaccess.client.session import SessionError, connect

    server_key = load_public_key(args.server_key) if args.server_key is not None else None
    try:
        with connect(
            args.server, args.key, args.researcher, server_key=server_key, ca_bundle=args.ca_bundle
        ) as session:
            listed = session.sequences()
    except SessionError as exc:
        raise CommandError(str(exc)) from exc
    if not listed:
        print("no sequences")
    for s in listed:
        mark = "resumable" if s["resumable"] else ("-" if s["journal"] is None else "kept")
        print(
            f"{s['id']}  {s['dataset']}@{s['dataset_version']}  {s['state']:<17} "
            f"step {s['current_index']}  {mark}"
        )
    return EXIT_OK


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, help="server URL, e.g. https://sac.example.org")
    parser.add_argument("--key", required=True, type=Path, help="your private key file")
    parser.add_argument("--researcher", required=True, help="your researcher name on the server")
    parser.add_argument(
        "--ca-bundle", type=Path, help="PEM file of the CA that issued the centre's TLS certificate"
    )
    parser.add_argument(
        "--server-key",
        type=Path,
        default=None,
        help="the centre's public key (PEM) to pin; receipts must verify with it",
    )


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--review-timeout",
        type=float,
        default=0.0,
        help="seconds to wait for an output checker on a step in review (default: do not wait)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the results folder here: outputs (CSV, JSON), receipts, the sealed sequence, "
        "summary.json and README.md",
    )


def _add_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser(
        "run", help="run a sealed sequence on a server, revealing each step after a release"
    )
    run.add_argument("sealed", metavar="SEALED.json", type=Path, help="sealed-sequence file")
    _connection_options(run)
    _run_options(run)
    run.set_defaults(handler=_run)

    resume = subparsers.add_parser(
        "resume",
        help="continue a sequence from the journal of sealed sequences (after a review, ...)",
    )
    resume.add_argument("sequence_id", metavar="ID", help="the sequence id `run` printed")
    _connection_options(resume)
    _run_options(resume)
    resume.set_defaults(handler=_resume)

    listing = subparsers.add_parser(
        "sequences", help="list your sequences at a centre and which can be resumed"
    )
    _connection_options(listing)
    listing.set_defaults(handler=_sequences)


def _add_audit(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from safeaccess.client.audit.cli import add_audit

    add_audit(subparsers)


def _add_ca(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from safeaccess.client.ca.cli import add_ca

    add_ca(subparsers)


_COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_keys,
    _add_run,
    _add_audit,
    _add_ca,
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="safeaccess",
        description="safeaccess researcher tools: keys, binding analysis sequences, runs.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to sys.exit)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except USER_ERRORS as exc:
        print(f"safeaccess: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except httpx.TransportError as exc:
        # The audit and CA commands talk to the server directly: the same one line as a session.
        from safeaccess.client.session import transport_reason

        where = getattr(getattr(exc, "_request", None), "url", None)
        url = f"{where.scheme}://{where.netloc.decode()}" if where is not None else "the server"
        print(f"safeaccess: error: cannot reach {url}: {transport_reason(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
