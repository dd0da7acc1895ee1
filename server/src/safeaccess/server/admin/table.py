"""The admin CLI's table of commands: what a row says, and the one handler that runs any row.

A `Command` row names the command (`("dataset", "list")`), its help, its arguments, the function
it calls and how its result prints. `build` turns the rows into argparse subcommands, in their
order; `run` is every command's handler: it calls the row's function with the command's
`Centre` (the data directory, and the store, opened when first used and closed when the call
ends, however it ends), then prints the result with the row's `show`, whose return is the exit
code (None: success).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Generic, TypeVar

from safeaccess.client.keys import KeyFileError
from safeaccess.server.config import DataDir, default_data_dir
from safeaccess.server.errors import ConfigError, ServiceError
from safeaccess.server.store import Store
from safeaccess.server.store.migrate import SchemaBehind

T = TypeVar("T")

#: Exit codes: success, a failure the command reports itself, a user error (one line on stderr).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USER_ERROR = 2

#: What `cli.main` reports as a user error: one line on stderr, exit code 2.
USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    ServiceError,
    KeyFileError,
    OSError,
    SchemaBehind,
)

#: One command group's action parsers (what `add_parser(...).add_subparsers()` returns).
SubParsers = argparse._SubParsersAction


class Centre:
    """A command's data directory and its store; the store is opened when first used (so a
    command checks its own arguments first) and closed by `run`."""

    def __init__(self, args: argparse.Namespace):
        self._data_dir = args.data_dir
        self._store: Store | None = None

    @cached_property
    def data(self) -> DataDir:
        return DataDir(self._data_dir if self._data_dir is not None else default_data_dir())

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.data.database_url(self.data.load_config()))
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


@dataclass(frozen=True)
class Arg:
    """One argument of a command: `parser.add_argument(*flags, **options)`."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


def _exit_code(_args: argparse.Namespace, result: Any) -> int | None:
    """A command whose function returns its own exit code (serve, worker, demo, ...)."""
    return int(result)


@dataclass(frozen=True)
class Command(Generic[T]):
    """One row: `words` (a group and an action, or one word), its help, its arguments, the
    function it calls and how its result prints."""

    words: tuple[str, ...]
    help: str
    call: Callable[[Centre, argparse.Namespace], T]
    show: Callable[[argparse.Namespace, T], int | None] = _exit_code
    arguments: tuple[Arg, ...] = field(default=())


#: A module that adds its own commands where it stands in the listing (the sandbox's, the
#: database schema's, the job queue's): `register(subparsers, common)`.
Registrar = Callable[[SubParsers, argparse.ArgumentParser], None]


def on_store(
    function: Callable[..., T], *names: str, **keywords: str
) -> Callable[[Centre, argparse.Namespace], T]:
    """The call `function(store, args.<name>, ..., keyword=args.<name>, ...)`: a function of
    the store and the arguments it takes from the command line."""

    def call(centre: Centre, args: argparse.Namespace) -> T:
        return function(
            centre.store,
            *(getattr(args, name) for name in names),
            **{key: getattr(args, name) for key, name in keywords.items()},
        )

    return call


def says(message: str) -> Callable[[argparse.Namespace, Any], None]:
    """Print `message`, its `{fields}` the command's arguments and `{result}` what it returned."""

    def show(args: argparse.Namespace, result: Any) -> None:
        print(message.format_map({**vars(args), "result": result}))

    return show


def lists(
    empty: str | None, line: Callable[[Any], str]
) -> Callable[[argparse.Namespace, Sequence[Any]], None]:
    """Print one `line` per item of the result, or `empty` (if any) when there is none."""

    def show(_args: argparse.Namespace, items: Sequence[Any]) -> None:
        if not items and empty is not None:
            print(empty)
        for item in items:
            print(line(item))

    return show


def run(command: Command[Any], args: argparse.Namespace) -> int:
    """Every command's handler: call the row's function, close what it opened, print."""
    centre = Centre(args)
    try:
        result = command.call(centre, args)
    finally:
        centre.close()
    code = command.show(args, result)
    return EXIT_OK if code is None else code


def build(
    sub: SubParsers,
    common: argparse.ArgumentParser,
    rows: Iterable[Command[Any] | Registrar],
    groups: dict[str, str],
) -> None:
    """Add the rows to the top-level subparsers `sub`, in order: a row of two words goes into
    its group (made, with its help from `groups`, at its first row)."""
    made: dict[str, SubParsers] = {}
    for row in rows:
        if not isinstance(row, Command):
            row(sub, common)
            continue
        into = sub
        if len(row.words) == 2:
            group = row.words[0]
            if group not in made:
                made[group] = sub.add_parser(group, help=groups[group]).add_subparsers(
                    dest=f"{group}_command", required=True, metavar="ACTION"
                )
            into = made[group]
        parser = into.add_parser(row.words[-1], parents=[common], help=row.help)
        for argument in row.arguments:
            parser.add_argument(*argument.flags, **argument.options)
        parser.set_defaults(handler=partial(run, row))
