"""Glue between the R package `safeaccess` and the Python client.

Only conversions live here (a result's frame as plain columns, a step's fields as plain data, a
Python exception as the fields of an R condition) and the two log checks the `safeaccess audit`
commands make, called with the same client functions. The protocol, signing, validation and
every check stay in the client: R never re-implements them.
"""

from __future__ import annotations

import base64
import json
import math
import traceback
from pathlib import Path
from typing import Any

from safeaccess.client.keys import load_public_key
from safeaccess.client.results import StepResult


def _cell(value: Any) -> Any:
    """One cell as a plain Python value; pandas' missing values (NA, NaT, None) as None."""
    if value is None:
        return None
    try:
        import pandas as pd

        if pd.isna(value) and not (isinstance(value, float) and math.isnan(value)):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    return value


def _kind(series: Any) -> str:
    """The R vector type of a frame column: logical, integer, double or character."""
    import pandas as pd

    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "logical"
    if pd.api.types.is_integer_dtype(dtype):
        values = [v for v in series if not pd.isna(v)]
        # R integers are 32-bit: larger counts stay doubles rather than overflow.
        return "integer" if all(abs(int(v)) < 2**31 for v in values) else "double"
    if pd.api.types.is_float_dtype(dtype):
        return "double"
    return "character"


def _label(value: Any) -> str:
    if isinstance(value, tuple):
        return ":".join(str(v) for v in value)
    return str(value)


def frame_columns(result: StepResult) -> dict[str, Any] | None:
    """`result.frame()` as plain columns for an R data.frame, or None when nothing is released.

    An R data.frame has no index, so a named index (the row variables of a table, a
    regression's `term`, a by-group) becomes leading columns, in order; an unnamed one that is
    not the default 0..n-1 (a correlation matrix's variables) becomes the row names. Column
    labels stay as `frame()` has them; a two-level column label (a table with two column
    variables) is joined with ':'. `frame.attrs` (a regression's n and fit) travels along.
    """
    import pandas as pd

    frame = result.frame()
    if frame is None:
        return None
    attrs = {str(k): _cell(v) for k, v in frame.attrs.items()}
    row_names = None
    index = frame.index
    if all(name is not None for name in index.names):
        frame = frame.reset_index()
    elif not isinstance(index, pd.RangeIndex):
        row_names = [_label(v) for v in index]
        frame = frame.reset_index(drop=True)
    names = [_label(c) for c in frame.columns]
    columns = []
    kinds = []
    for position in range(frame.shape[1]):
        series = frame.iloc[:, position]
        kind = _kind(series)
        kinds.append(kind)
        cells = [_cell(v) for v in series]
        if kind == "character":
            cells = [None if v is None else str(v) for v in cells]
        elif kind == "integer":
            cells = [None if v is None else int(v) for v in cells]
        elif kind == "double":
            cells = [None if v is None else float(v) for v in cells]
        columns.append(cells)
    return {
        "names": names,
        "kinds": kinds,
        "columns": columns,
        "row_names": row_names,
        "attrs": attrs,
    }


def step_fields(result: StepResult) -> dict[str, Any]:
    """The fields of a step result as plain data (the R object's list elements)."""
    return {
        "sequence_id": result.sequence_id,
        "index": result.index,
        "status": result.status,
        "last": result.last,
        "kind": result.kind,
        "dataset": result.dataset_label,
        "dataset_version": result.dataset_version,
        "sequence_state": result.sequence_state,
        "reasons": [
            {"check": r.check, "verdict": r.verdict, "item": r.item, "message": r.message}
            for r in result.reasons
        ],
        "error_code": result.error_code,
        "error_message": result.error_message,
        "ruleset": result.ruleset,
        "review_note": result.review_note,
        "withhold_budget": None if result.withhold_budget is None else str(result.withhold_budget),
        "analysis": result.analysis,
        "output": result.output,
        "receipt": result.receipt,
        "description": result.describe(),
    }


def error_fields(exc: BaseException) -> dict[str, Any]:
    """What an R condition carries of a Python exception: its class, its message exactly as
    Python words it (no traceback), its machine-readable code and, for a plan-time refusal, each
    problem's field and message."""
    problems = [
        {"field": str(p.field), "message": str(p.message)} for p in getattr(exc, "problems", [])
    ]
    code = getattr(exc, "code", None)
    return {
        "python_class": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc) or type(exc).__name__,
        "code": code if isinstance(code, str) else None,
        "status": getattr(exc, "status", None),
        "problems": problems,
        "classes": [c.__name__ for c in type(exc).__mro__ if c not in (object, BaseException)],
    }


def last_traceback(exc: BaseException) -> str:
    """The Python traceback, for `sa_last_traceback()` only (never in a condition's message)."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def receipt_file_data(path: str) -> dict[str, Any]:
    """A saved receipt (`receipts/NN.json` of a results folder: the receipt with its output)."""
    data: dict[str, Any] = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    return data


def step_receipt_data(result: StepResult) -> dict[str, Any]:
    """A received step's receipt with its output, as a results folder saves it."""
    return {"receipt": result.receipt, "output": result.output}


def check_receipt_in_log(
    data: dict[str, Any],
    url: str,
    key: str,
    researcher: str,
    server_key: str | None = None,
    ca_bundle: str | None = None,
) -> dict[str, Any]:
    """What `safeaccess audit receipt` checks, with the same functions: the receipt is the
    centre's, its log entry is in a signed checkpoint, records this step and outcome and commits
    to exactly this output, and the output served today opens the same commitment. Raises
    `AuditFailure` otherwise."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from safeaccess.client.audit.receipt import check_receipt
    from safeaccess.client.audit.remote import SignedClient

    receipt = data.get("receipt", data)
    output = data.get("output")
    fields = receipt.get("fields", {}) if isinstance(receipt, dict) else {}
    client = SignedClient(url, Path(key).expanduser(), researcher, ca_bundle=ca_bundle)
    try:
        health = client.health()
        pinned = (
            load_public_key(Path(server_key).expanduser())
            if server_key is not None
            else Ed25519PublicKey.from_public_bytes(base64.b64decode(health["server_public_key"]))
        )
        base = f"/v1/sequences/{fields.get('sequence')}/steps/{fields.get('step')}"
        proof = client.get(base + "/proof").json()
        served = client.get(base).json().get("output")
        checked = check_receipt(receipt, output, proof, pinned, str(health["server_id"]), served)
    finally:
        client.close()
    return {
        "sequence": fields.get("sequence"),
        "step": fields.get("step"),
        "state": checked.state,
        "entry": checked.entry,
        "size": checked.size,
        "output_checked": checked.output_checked,
    }


def audit_verify(
    server: str | None = None,
    key: str | None = None,
    auditor: str | None = None,
    export: str | None = None,
    server_key: str | None = None,
    trusted_checkpoint: str | None = None,
    save_checkpoint: str | None = None,
    ca_bundle: str | None = None,
) -> dict[str, Any]:
    """What `safeaccess audit verify` checks, with the same functions: the whole log (over the
    server, signed as an auditor, or an export file) replays, every entry is in the signed tree,
    and it extends a trusted checkpoint when one is given. Raises `AuditFailure` (or
    `LogDamaged`) otherwise; returns the report's lines and the verified checkpoint."""
    from safeaccess.client.audit.remote import ServerSource, SignedClient
    from safeaccess.client.audit.verify import ExportSource, LogSource, verify_log

    pinned = load_public_key(Path(server_key).expanduser()) if server_key is not None else None
    client = None
    source: LogSource
    try:
        if export is not None:
            exported = ExportSource(Path(export).expanduser())
            if pinned is not None:
                exported.server_key = pinned
            source = exported
        else:
            if server is None or key is None or auditor is None:
                raise ValueError("verifying over a server needs server, key and auditor")
            client = SignedClient(server, Path(key).expanduser(), auditor, ca_bundle=ca_bundle)
            source = ServerSource(client, pinned)
        trusted = Path(trusted_checkpoint).expanduser() if trusted_checkpoint else None
        report = verify_log(source, trusted=trusted)
    finally:
        if client is not None:
            client.close()
    if save_checkpoint is not None:
        Path(save_checkpoint).expanduser().write_text(report.checkpoint, encoding="utf-8")
    return {
        "server_id": source.server_id,
        "lines": report.lines(),
        "checkpoint": report.checkpoint,
        "pinned": pinned is not None,
    }


class Outcome:
    """A call's value, or the exception it raised (see `call`)."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.ok = error is None
        self.value = value
        self.error = error


def call(function: Any, *args: Any, **kwargs: Any) -> Outcome:
    """Call `function` and return its value or the exception it raised, so that R turns the
    exception itself (its class, message, code and problems) into a condition, whatever the
    version of reticulate does with a raised one."""
    try:
        return Outcome(function(*args, **kwargs))
    except Exception as exc:
        return Outcome(error=exc)


def plan_lines(plan: Any) -> list[str]:
    """One line per planned analysis: its position, kind and the fields it sets."""
    lines = []
    for i, analysis in enumerate(plan, start=1):
        fields = analysis.model_dump(mode="json", exclude_defaults=True)
        fields.pop("kind", None)
        shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in fields.items())
        lines.append(f"{i}. {analysis.kind}({shown})")
    return lines


def rehearsal_steps(report: Any) -> list[dict[str, Any]]:
    """A rehearsal's steps as plain data."""
    return [
        {
            "index": s.index,
            "kind": s.kind,
            "refused": "; ".join(s.refused),
            "mock_verdict": s.mock_verdict,
            "checks": "; ".join(str(c) for c in s.checks),
            "doomed": bool(s.doomed),
        }
        for s in report.steps
    ]


# ------------------------------------------------------------------------ a local demo centre


def free_port() -> int:
    """A loopback port free right now, for the demo centre's server process."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def demo_prepare(root: str, rows: int) -> dict[str, str]:
    """A data directory as `safeaccess-server demo` prepares it (the generated census and its DP
    twin, the demo project, researcher `ada`), plus an auditor `demo-auditor`; the two private
    keys are written as files (mode 0600) next to it. Needs the server distribution."""
    from safeaccess.client.keys import (
        fingerprint,
        generate_keypair,
        load_private_key,
        public_key_text,
    )
    from safeaccess.server.config import DataDir
    from safeaccess.server.demo.run import PROJECT, RESEARCHER, prepare
    from safeaccess.server.store import Store

    base = Path(root)
    keys = base / "keys"
    researcher_key, _ = generate_keypair(RESEARCHER, keys)
    auditor_key, _ = generate_keypair("demo-auditor", keys)
    data = base / "data"
    prepare(data, rows=rows, researcher_key=load_private_key(researcher_key))
    auditor = load_private_key(auditor_key).public_key()
    store = Store(DataDir(data).database_url(DataDir(data).load_config()))
    try:
        store.add_auditor("demo-auditor", public_key_text(auditor), fingerprint(auditor))
    finally:
        store.close()
    return {
        "data": str(data),
        "key": str(researcher_key),
        "researcher": RESEARCHER,
        "project": PROJECT,
        "auditor_key": str(auditor_key),
        "auditor": "demo-auditor",
    }


def wait_until_up(url: str, timeout: float) -> bool:
    """Whether the server at `url` answered /v1/health within `timeout` seconds."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


def serve_centre(root: str, rows: int, port: int, setup: str | None = None) -> int:
    """Prepare a demo centre in `root` (`demo_prepare`), run `setup(data_dir)` from the Python
    file `setup` if given (e.g. to register another dataset), then serve it on the loopback
    `port` with `safeaccess-server serve` until stopped. One process imports the server once."""
    from safeaccess.server.admin.cli import main as server_main

    centre = demo_prepare(root, rows)
    if setup is not None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("safeaccess_r_setup", setup)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load the setup file {setup}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.setup(Path(centre["data"]))
    Path(root, "centre.json").write_text(json.dumps(centre), encoding="utf-8")
    return int(server_main(["serve", "--data-dir", centre["data"], "--port", str(port)]))


if __name__ == "__main__":
    import sys

    sys.exit(
        serve_centre(
            sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None
        )
    )
