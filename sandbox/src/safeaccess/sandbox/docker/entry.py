"""Entry point of a Docker sandbox container: preload, wait for one request, run the runner once.

The Docker backend starts containers ahead of need (the warm pool). Each container runs this
module, which first imports the runner and the heavy analysis libraries — the part of a job's
start-up that costs most — and then blocks reading its request from stdin, framed as an 8-byte
big-endian length followed by that many bytes of `RunnerRequest` JSON. The frame makes the end of
the request explicit, so the backend never has to half-close the attach stream.

The request is then handed to the unchanged runner (`python -m safeaccess.sandbox.runner`) on a
fresh stdin pipe, exactly as the process backend hands it over. One container serves one request:
when the runner returns, the process exits at once and the container ends.

This module runs inside the sandbox only; it imports nothing from the host side.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
import threading

RUNNER = "safeaccess.sandbox.runner"
# What a warm container imports before its job: the light template family's modules
# (runner/kinds.py), and the full family's when the container's memory limit leaves room.
# Below that, a job that needs the model libraries imports them itself.
PRELOAD_MODELS_MIN_BYTES = 1024 * 1024 * 1024
# Set to "0" by the backend for a container started for a job already waiting (cold start): there
# preloading libraries the job may not need would only delay it.
ENV_PRELOAD = "SAFEACCESS_SANDBOX_PRELOAD"
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
MAX_REQUEST_BYTES = 64 * 1024 * 1024
LENGTH_BYTES = 8
# Written on stdout once preloading is done: the backend hands out only containers that said it.
READY_MARKER = b"safeaccess-sandbox-ready\n"
# Written on stdout after the runner returned: the response is complete, no need to wait for the
# container to exit. (A job that forges it early only cuts its own response short.)
DONE_MARKER = b"\nsafeaccess-sandbox-done\n"


class RequestError(Exception):
    """The request frame on stdin was missing, cut short or too large."""


def _read_exact(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise RequestError(f"stdin closed after {size - remaining} of {size} bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_request(fd: int = 0) -> bytes:
    """Read one length-prefixed request frame from `fd`."""
    length = int.from_bytes(_read_exact(fd, LENGTH_BYTES), "big")
    if length > MAX_REQUEST_BYTES:
        raise RequestError(f"request of {length} bytes exceeds {MAX_REQUEST_BYTES}")
    return _read_exact(fd, length)


def memory_limit() -> int | None:
    """This container's memory limit in bytes, from its cgroup (v2 or v1), if it has one."""
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def preload(modules: tuple[str, ...] | None = None) -> None:
    """Import what jobs need; a failure here resurfaces when the runner itself imports."""
    if modules is None and os.environ.get(ENV_PRELOAD) == "0":
        modules = ()
    if modules is None:
        limit = memory_limit()
        roomy = limit is None or limit >= PRELOAD_MODELS_MIN_BYTES
        try:
            from safeaccess.sandbox.runner.kinds import preload_modules
        except Exception:  # the runner reports the real error with its own import
            return
        modules = preload_modules("full" if roomy else "tables")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 - the runner reports the real error with its own import
            continue


def _feed_stdin(payload: bytes) -> None:
    """Make fd 0 a pipe that yields `payload` then end-of-file, like a subprocess's stdin."""
    read_end, write_end = os.pipe()

    def writer() -> None:
        try:
            _write_all(write_end, payload)
        finally:
            os.close(write_end)

    threading.Thread(target=writer, name="stdin-feeder", daemon=True).start()
    os.dup2(read_end, 0)
    os.close(read_end)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - lives as long as the process


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def run_runner() -> int:
    """Run the runner once, as `python -m safeaccess.sandbox.runner` would; return its status.

    Its `main()` is called directly when it has one, so that control comes back here to mark the
    end of the response (the runner's own `__main__` block may end the process at once).
    """
    try:
        module = importlib.import_module(RUNNER)
        runner_main = getattr(module, "main", None)
        if callable(runner_main):
            status = runner_main()
            return status if isinstance(status, int) else 0
        sys.modules.pop(RUNNER, None)  # let runpy execute it afresh as __main__
        runpy.run_module(RUNNER, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def main() -> None:
    preload()
    _write_all(1, READY_MARKER)
    try:
        payload = read_request(0)
    except RequestError as exc:
        print(f"safeaccess sandbox entry: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _feed_stdin(payload)
    sys.argv = [RUNNER]
    response_out = os.dup(1)  # the runner redirects fd 1; keep a way to mark the end
    code = run_runner()
    # The runner has written and closed its response. Skip interpreter teardown (tens of ms with
    # pandas loaded): the container is discarded after this one job anyway.
    if code == 0:
        _write_all(response_out, DONE_MARKER)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
