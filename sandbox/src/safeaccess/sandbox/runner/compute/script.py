"""Researcher scripts -> ScriptOutput (always sent to human review).

Running researcher code is the purpose of the sandbox, and this module is only ever called by the
runner *inside* it: never import and call it in the server process. The script sees `df` (the
filtered data), `pd` and `np`; what it prints is captured up to a cap, and a JSON-serialisable
value assigned to `result` is returned. If the script raises, the run fails (`ScriptRaised`):
a failed script is never approvable, and neither its traceback (which names the runner's own
frames and install path, outside the sandbox's view of the script) nor its exception's text
(which the script chooses, from the data if it likes) reaches any output.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
from typing import Any

import numpy as np
import pandas as pd

from safeaccess.client.analyses import Script
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import ScriptFacts, ScriptOutput

MAX_STDOUT_CHARS = 1_000_000
MAX_RESULT_CHARS = 1_000_000


class ProcessLimitReached(Exception):
    """The script could not create a process or thread: the sandbox's process limit was hit."""


class ScriptRaised(Exception):
    """The script raised: its step fails. Carries the exception's type name only."""


class _CappedText(io.TextIOBase):
    """A text sink keeping at most `cap` characters (and counting what it dropped)."""

    def __init__(self, cap: int):
        self._cap = cap
        self._parts: list[str] = []
        self._size = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        room = self._cap - self._size
        kept = text[: max(room, 0)]
        if kept:
            self._parts.append(kept)
            self._size += len(kept)
        self.dropped += len(text) - len(kept)
        return len(text)

    def getvalue(self) -> str:
        return "".join(self._parts)


def script(
    analysis: Script, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> ScriptOutput:
    """Execute the script (inside the sandbox) and capture its output."""
    namespace: dict[str, Any] = {
        "__name__": "__script__",
        "df": frame.reset_index(drop=True),
        "pd": pd,
        "np": np,
    }
    sink = _CappedText(MAX_STDOUT_CHARS)
    runner_pid = os.getpid()
    raised: str | None = None
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            code = compile(analysis.code, "<script>", "exec")
            exec(code, namespace)  # noqa: S102 - runs only inside the sandbox; that is its purpose
        except MemoryError:
            raise
        except BlockingIOError as exc:
            if os.getpid() == runner_pid and exc.errno == errno.EAGAIN:
                raise ProcessLimitReached from exc
            raised = type(exc).__name__
        except BaseException as exc:  # a script may raise anything, SystemExit included
            raised = type(exc).__name__
        finally:
            if os.getpid() != runner_pid:
                # A process the script forked must not go on to write a runner response.
                os._exit(0)
    if raised is not None:
        # Raised outside the try so no exception context (the script's traceback) is chained.
        raise ScriptRaised(raised)
    result: Any = None
    if "result" in namespace:
        try:
            text = json.dumps(namespace["result"], allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            sink.write("\n[`result` is not JSON-serialisable and was dropped]\n")
        else:
            if len(text) > MAX_RESULT_CHARS:
                sink.write(f"\n[`result` exceeds {MAX_RESULT_CHARS} characters and was dropped]\n")
            else:
                result = json.loads(text)
    stdout = sink.getvalue()
    if sink.dropped:
        stdout += f"\n[output truncated: {sink.dropped} characters dropped]\n"
    return ScriptOutput(
        stdout=stdout,
        result=result,
        facts=ScriptFacts(stdout_bytes=len(stdout.encode("utf-8"))),
    )
