"""The results of a run as a list you can save: `results.save(dir)` writes the results folder.

    results = session.run(sealed)
    results.save("census-2026-11")

The folder holds, for a sequence:

    sealed.json                 the sealed sequence (what you bound yourself to)
    summary.json, README.md     the steps, their verdicts, reasons, file names and hashes
    steps/NN-KIND.json          every released output in full (JSON)
    steps/NN-KIND.csv           its tabular form, where it has one (needs pandas)
    receipts/NN.json            each final step's signed receipt exactly as received, with the
                                output it commits to: `safeaccess audit receipt receipts/NN.json`

Only stable facts are written (no "as of now" fields such as the withhold budget), so saving the
same finished sequence again, e.g. after `safeaccess run` on it a second time, writes the same
bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from safeaccess.client.missing_values import IMPUTATION, missing_rows
from safeaccess.client.protocol.errors import ProtocolError
from safeaccess.client.protocol.sealed import SealedSequence
from safeaccess.client.results import StepResult

SUMMARY_FORMAT = "safeaccess-results/1"


class ResultsFolderError(Exception):
    """The results folder cannot be written as asked (the message says what to change)."""


class Results(list[StepResult]):
    """The results of the revealed steps of one sealed sequence, in order (a plain list of
    `StepResult` that also knows its sealed sequence)."""

    def __init__(self, sealed: SealedSequence, results: list[StepResult] | None = None) -> None:
        super().__init__(results or [])
        self.sealed = sealed

    @property
    def finished(self) -> bool:
        """Every step of the sequence was released."""
        return bool(self) and self[-1].released and self[-1].last

    def _repr_html_(self) -> str:
        from safeaccess.client.notebook import results_html

        return results_html(self)

    def save(self, directory: str | Path) -> Path:
        """Write the results folder into `directory` (created if needed); returns its path."""
        return save_results(self, self.sealed, directory)


def _dump(data: Any) -> str:
    # Sorted keys and a trailing newline: the same data always gives the same bytes.
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _csv(result: StepResult) -> str | None:
    """The released output's frame as CSV, or None without a tabular form or without pandas."""
    try:
        frame = result.frame()
    except ImportError:
        return None
    if frame is None:
        return None
    text: str = frame.to_csv(lineterminator="\n")
    return text


def _check_folder(directory: Path, sequence_id: str) -> None:
    """Refuse to mix two sequences' results in one folder (nothing is written then)."""
    if directory.exists() and not directory.is_dir():
        raise ResultsFolderError(f"{directory} is a file; give a folder for the results")
    summary = directory / "summary.json"
    if not summary.exists():
        return
    try:
        earlier = json.loads(summary.read_text(encoding="utf-8")).get("sequence_id")
    except (ValueError, AttributeError):
        earlier = None
    if earlier != sequence_id:
        raise ResultsFolderError(
            f"{directory} already holds the results of another sequence ({earlier}); "
            "choose an empty folder"
        )


def check_folder_for(sealed: SealedSequence, directory: str | Path) -> None:
    """Before any step runs: refuse a folder that holds another sealed sequence's results, so
    that `run --out DIR` fails before revealing anything rather than after every step ran."""
    folder = Path(directory).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ResultsFolderError(f"{folder} is a file; give a folder for the results")
    if not (folder / "summary.json").exists():
        return
    try:
        kept = SealedSequence.from_json((folder / "sealed.json").read_bytes())
        same = kept.header == sealed.header
    except (OSError, ValueError, ProtocolError):
        same = False
    if not same:
        raise ResultsFolderError(
            f"{folder} already holds the results of another sequence; choose an empty folder "
            "(nothing was revealed)"
        )


def save_results(results: list[StepResult], sealed: SealedSequence, directory: str | Path) -> Path:
    """Write the results folder of `results` (the steps of `sealed`) into `directory`."""
    if not results:
        raise ResultsFolderError("no step has run yet; there is nothing to save")
    folder = Path(directory).expanduser()
    sequence_id = results[0].sequence_id
    _check_folder(folder, sequence_id)
    files: dict[str, str] = {}
    records: dict[str, bytes] = {}  # released files (synthetic records), written as received
    steps: list[dict[str, Any]] = []
    sealed_text = sealed.to_json() + "\n"
    files["sealed.json"] = sealed_text
    for result in results:
        stem = f"{result.index:02d}-{result.kind or 'analysis'}"
        entry: dict[str, Any] = {
            "index": result.index,
            "kind": result.kind,
            "status": result.status,
            "last": result.last,
            "dataset": result.dataset_label,
            "ruleset": result.ruleset,
            "reasons": [
                {"check": r.check, "verdict": r.verdict, "item": r.item, "message": r.message}
                for r in result.reasons
            ],
            "review_note": result.review_note,
            "output": None,
            "csv": None,
            "receipt": None,
        }
        if result.failed:
            entry["error"] = {"code": result.error_code, "message": result.error_message}
        if result.output is not None:
            name = f"steps/{stem}.json"
            files[name] = _dump(result.output)
            entry["output"] = name
            entry["output_sha256"] = _sha256(files[name].encode())
            missing = missing_rows(result.output)
            if missing is not None:
                # Records left out for a missing value, per variable and group; none imputed.
                entry["missing"] = missing
                entry["imputation"] = IMPUTATION
            if result.file_data is not None:
                # The synthetic records, byte for byte as released (their SHA-256 is the one in
                # the output, which the receipt commits to).
                records[f"steps/{stem}.parquet"] = result.file_data
                entry["file"] = f"steps/{stem}.parquet"
                entry["file_sha256"] = _sha256(result.file_data)
            table = _csv(result)
            if table is not None:
                files[f"steps/{stem}.csv"] = table
                entry["csv"] = f"steps/{stem}.csv"
        if result.receipt is not None:
            name = f"receipts/{result.index:02d}.json"
            # The receipt exactly as received, with the output its commitment opens.
            files[name] = _dump({"receipt": result.receipt, "output": result.output})
            entry["receipt"] = name
            fields = result.receipt.get("fields", {})
            for key in ("header_sha256", "body_sha256", "output_commitment", "log_index"):
                if key in fields:
                    entry[key] = fields[key]
        steps.append(entry)
    header = sealed.header_fields
    summary = {
        "format": SUMMARY_FORMAT,
        "sequence_id": sequence_id,
        "server": header.server,
        "researcher": header.researcher,
        "project": header.project,
        "dataset": header.dataset,
        "header_sha256": _sha256(sealed.header),
        "sealed_sha256": _sha256(sealed_text.encode()),
        "steps_sealed": sealed.steps,
        "steps_revealed": len(results),
        "outcome": _outcome(results, sealed.steps),
        "steps": steps,
    }
    files["summary.json"] = _dump(summary)
    files["README.md"] = _readme(summary)
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for name, data in records.items():
        (folder / name).write_bytes(data)
    return folder


def _outcome(results: list[StepResult], total: int) -> str:
    final = results[-1]
    if final.released and final.last:
        return f"finished: all {total} steps released"
    return f"stopped at step {final.index} of {total} ({final.status})"


def _readme(summary: dict[str, Any]) -> str:
    lines = [
        f"# Results of sequence {summary['sequence_id']}",
        "",
        f"- server: {summary['server']}",
        f"- researcher: {summary['researcher']}, project: {summary['project']}",
        f"- dataset: {summary['dataset']}",
        f"- outcome: {summary['outcome']}",
        f"- signed header SHA-256: `{summary['header_sha256']}`",
        "",
        "| step | kind | verdict | output | receipt |",
        "|---|---|---|---|---|",
    ]
    for step in summary["steps"]:
        shown = (step["output"], step["csv"], step.get("file"))
        files = ", ".join(f"[{p}]({p})" for p in shown if p) or "—"
        receipt = f"[{step['receipt']}]({step['receipt']})" if step["receipt"] else "—"
        lines.append(
            f"| {step['index']} | {step['kind']} | {step['status']} | {files} | {receipt} |"
        )
    reasons = [(s["index"], r) for s in summary["steps"] for r in s["reasons"]]
    if reasons:
        lines += ["", "## Reasons given", ""]
        lines += [
            f"- step {index}: {r['check']}"
            + (f" [{r['item']}]" if r["item"] else "")
            + f": {r['message']}"
            for index, r in reasons
        ]
    lines += [
        "",
        "`sealed.json` is the sealed sequence. Check a step's receipt against the centre's audit "
        "log with `safeaccess audit receipt receipts/NN.json --server URL --key KEY "
        "--researcher NAME`.",
        "",
    ]
    return "\n".join(lines)


__all__ = ["Results", "ResultsFolderError", "check_folder_for", "save_results"]
