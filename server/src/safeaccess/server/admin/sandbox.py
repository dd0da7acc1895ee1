"""`safeaccess-server sandbox ...`: build the Docker sandbox image, check the configured backend.

    safeaccess-server sandbox build-image [--host URL] [--data-dir DIR | --config FILE] [--rebuild]
    safeaccess-server sandbox check [--data-dir DIR | --config FILE]

`build-image` assembles the sandbox image from this machine's Python installation (no registry
needed), prints its id (``sha256:...``) on stdout and, given a data directory or configuration
file, records it as `sandbox.docker.image` there. Also runnable as
``python -m safeaccess.server.admin.sandbox build-image``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from safeaccess.sandbox.backend import SandboxError
from safeaccess.sandbox.config import DockerOptions, SandboxConfig
from safeaccess.sandbox.factory import make_backend
from safeaccess.server.config import CONFIG_FILE, default_data_dir, read_config, set_sandbox_image
from safeaccess.server.errors import ConfigError

EXIT_OK = 0
EXIT_ERROR = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `sandbox` command group to the `safeaccess-server` parser."""
    sandbox = subparsers.add_parser("sandbox", help="the Docker sandbox: build its image, check it")
    add_actions(sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION"))


def add_actions(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `build-image` and `check` to a sub-command group."""
    where = argparse.ArgumentParser(add_help=False)
    group = where.add_mutually_exclusive_group()
    group.add_argument(
        "--data-dir", type=Path, default=None, help=f"data directory whose {CONFIG_FILE} to use"
    )
    group.add_argument("--config", type=Path, default=None, help="server configuration file")

    build = actions.add_parser(
        "build-image",
        parents=[where],
        help="build the sandbox image from the local Python installation and print its id",
        description="Build the sandbox image from this machine's Python installation (runner, "
        "analysis libraries, the shared libraries they need; no server code, data, keys or "
        "tests). Prints the image id. With --data-dir or --config, also writes it to "
        "sandbox.docker.image in that configuration (YAML comments are not kept).",
    )
    build.add_argument(
        "--host",
        default=None,
        help="Docker Engine address (default: the configuration's sandbox.docker.host, else "
        "$DOCKER_HOST, else unix:///var/run/docker.sock)",
    )
    build.add_argument(
        "--rebuild",
        action="store_true",
        help="import a new image even if one built from the same files exists",
    )
    build.add_argument(
        "--prune",
        action="store_true",
        help="remove older sandbox images made by this command (those no container uses)",
    )
    build.set_defaults(handler=build_image_command)

    check = actions.add_parser(
        "check",
        parents=[where],
        help="check that the configured sandbox backend can isolate jobs here",
    )
    check.set_defaults(handler=check_command)


def _config_path(args: argparse.Namespace) -> Path | None:
    if args.config is not None:
        return Path(args.config)
    if args.data_dir is not None:
        return Path(args.data_dir) / CONFIG_FILE
    return None


def _sandbox_config(path: Path | None) -> SandboxConfig:
    if path is None:
        path = default_data_dir() / CONFIG_FILE
        if not path.is_file():
            return SandboxConfig()
    return read_config(path).sandbox


def build_image_command(args: argparse.Namespace) -> int:
    """Handler of `sandbox build-image`."""
    from safeaccess.sandbox.docker import build_image, connect, engine_address
    from safeaccess.sandbox.docker.image import prune_images

    try:
        path = _config_path(args)
        config = _sandbox_config(path)
        options = DockerOptions(host=args.host or config.docker.host)
        host = engine_address(options)
        print(f"building the sandbox image on {host} ...", file=sys.stderr)
        try:
            client = connect(host)
            client.ping()
        except Exception as exc:
            raise SandboxError(f"cannot reach the Docker Engine at {host}: {exc}") from exc
        built = build_image(client, reuse=not args.rebuild)
        how = "reused an identical image" if built.reused else f"imported {built.files} files"
        print(f"{how}: {built.image_id}", file=sys.stderr)
        if args.prune:
            removed = prune_images(client, keep=built.image_id)
            print(f"removed {len(removed)} older sandbox image(s)", file=sys.stderr)
        if path is not None:
            set_sandbox_image(path, built.image_id)
            print(f"wrote sandbox.docker.image to {path}", file=sys.stderr)
    except (SandboxError, ConfigError) as exc:
        print(f"safeaccess-server: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(built.image_id)
    return EXIT_OK


def check_command(args: argparse.Namespace) -> int:
    """Handler of `sandbox check`: build the configured backend exactly as the server does."""
    try:
        config = _sandbox_config(_config_path(args))
        backend = make_backend(config)
    except (SandboxError, ConfigError) as exc:
        print(f"safeaccess-server: sandbox unusable: {exc}", file=sys.stderr)
        return EXIT_ERROR
    backend.close()
    print(f"sandbox backend '{backend.name}' is usable")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m safeaccess.server.admin.sandbox build-image ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m safeaccess.server.admin.sandbox", description=__doc__.split("\n")[0]
    )
    add_actions(parser.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
