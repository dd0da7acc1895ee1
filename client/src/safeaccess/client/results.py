"""Step results as the researcher receives them: status, reasons, and the released output.

Outputs are plain JSON data; where pandas is installed, `StepResult.frame()` turns tables,
regressions, correlations and summaries into DataFrames. pandas is imported only on demand, so
the client works without it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from safeaccess.client.audit.records import opens
from safeaccess.client.dpresult import DPResult
from safeaccess.client.missing_values import IMPUTATION, missing_note, missing_rows
from safeaccess.client.protocol import canonical

if TYPE_CHECKING:
    from safeaccess.client.protocol.sealed import SealedSequence

StepStatus = Literal["pending", "running", "released", "withheld", "review", "failed"]


@dataclass(frozen=True)
class Reason:
    """Why a step was withheld or sent to review (a check, the cell it fired on, what it means)."""

    check: str
    verdict: str
    item: str | None
    message: str

    def __str__(self) -> str:
        where = f" [{self.item}]" if self.item else ""
        return f"{self.check}{where}: {self.message}"


@dataclass(frozen=True)
class WithholdBudget:
    """How many more withholds you may receive on a dataset (all versions) within the window
    before new sequences on it wait for an output checker's approval."""

    dataset: str
    count: int
    days: int
    used: int
    remaining: int

    def __str__(self) -> str:
        return (
            f"withhold budget on {self.dataset}: {self.remaining} of {self.count} left "
            f"(last {self.days} days)"
        )


@dataclass(frozen=True)
class StepResult:
    """The state and, once released, the output of one step of a sequence."""

    sequence_id: str
    index: int
    status: StepStatus
    last: bool
    kind: str | None
    analysis: dict[str, Any] | None
    output: dict[str, Any] | None
    reasons: tuple[Reason, ...] = ()
    error_code: str | None = None
    error_message: str | None = None
    ruleset: str | None = None
    sequence_state: str = ""
    receipt: dict[str, Any] | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    review_note: str | None = None
    withhold_budget: WithholdBudget | None = None
    dataset: str | None = None
    dataset_version: int | None = None
    # A released synthetic_data step's Parquet file, fetched by `Session.run` and checked
    # against the SHA-256 in the output (which the receipt commits to); None otherwise.
    file_data: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def dataset_label(self) -> str | None:
        """`name@version` of the dataset version the step ran on, when the server says."""
        if self.dataset is None:
            return None
        return (
            self.dataset
            if self.dataset_version is None
            else (f"{self.dataset}@{self.dataset_version}")
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepResult:
        """Build from the server's StepView JSON."""
        error = data.get("error") or {}
        return cls(
            sequence_id=data["sequence_id"],
            index=int(data["index"]),
            status=data["state"],
            last=bool(data["last"]),
            kind=data.get("kind"),
            analysis=data.get("analysis"),
            output=data.get("output"),
            reasons=tuple(
                Reason(
                    check=r["check"], verdict=r["verdict"], item=r.get("item"), message=r["message"]
                )
                for r in data.get("reasons") or []
            ),
            error_code=error.get("code"),
            error_message=error.get("message"),
            ruleset=data.get("ruleset"),
            sequence_state=data.get("sequence_state", ""),
            dataset=data.get("dataset"),
            dataset_version=(
                int(data["dataset_version"]) if data.get("dataset_version") is not None else None
            ),
            receipt=data.get("receipt"),
            raw=data,
            review_note=data.get("review_note"),
            withhold_budget=(
                WithholdBudget(**data["withhold_budget"]) if data.get("withhold_budget") else None
            ),
        )

    @property
    def released(self) -> bool:
        return self.status == "released"

    @property
    def dp(self) -> DPResult | None:
        """The released differentially private answer with its inference, else None."""
        if self.output is None or self.output.get("type") != "dp_answer":
            return None
        return DPResult(self.output)

    def model(self) -> Any:
        """The released model as a `safeaccess.client.models.Predictor`, else None."""
        if self.output is None or self.output.get("type") != "model":
            return None
        from safeaccess.client.models import Predictor

        return Predictor(self.output)

    def roc(self) -> Any:
        """The released ROC curve of a trained model (`train_model(..., roc=True)`) as a
        DataFrame of `fpr` and `tpr`, from (0, 0) to (1, 1); None when nothing was released.
        Raises ValueError for a model released without one (not asked, or a class of its test
        split smaller than one step)."""
        if self.output is None:
            return None
        if self.output.get("type") != "model":
            raise ValueError(f"a {self.output.get('type')} output has no ROC curve")
        points = self.output.get("roc")
        if points is None:
            raise ValueError(
                "this model was released without a ROC curve: train it with roc=True (two "
                "classes, at least 10 test records of each)"
            )
        import pandas as pd

        return pd.DataFrame(points, columns=["fpr", "tpr"])

    @property
    def withheld(self) -> bool:
        return self.status == "withheld"

    @property
    def in_review(self) -> bool:
        return self.status == "review"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def awaiting_approval(self) -> bool:
        """Past the withhold budget: an output checker must approve opening the sequence."""
        return self.status == "pending"

    def frame(self) -> Any:
        """The released output as a pandas DataFrame; None if nothing was released.

        A rule-checked answer's records left out for a missing value are in
        `attrs["missing"]` (one line per variable and group; a count below the threshold shows
        as suppressed) and `attrs["imputation"]` ("none": no kind imputes); a summary's frame
        also has them per variable and group in its `missing` column.
        """
        frame = self._frame()
        note = missing_note(self.output)
        if frame is not None and note is not None:
            frame.attrs["missing"] = note
            frame.attrs["imputation"] = IMPUTATION
        return frame

    def missing(self) -> Any:
        """The records the released answer left out for a missing value, as a DataFrame
        (variables, group, count, suppressed); None when nothing was released or the kind
        reports none (DP answers carry a noisy `missing` component instead)."""
        rows = missing_rows(self.output)
        if rows is None:
            return None
        import pandas as pd

        return pd.DataFrame(rows, columns=["variables", "group", "count", "suppressed"])

    def _frame(self) -> Any:
        """The released output as a pandas DataFrame; None if nothing was released.

        Tables and histograms, summaries, correlations, regressions (coefficients; `attrs` keeps
        n, df_resid, df_model and the fit such as R²), tests (one row), trained models (their
        test metrics), scripts (their `result`, else their printed output), survival tables (one
        row per step) and DP answers (estimates and standard errors; a DP mean test's result).

        Raises ImportError with an install hint when pandas is missing.
        """
        if self.output is None:
            return None
        if self.output.get("type") == "synthetic_data" and self.file_data is not None:
            from safeaccess.client.synthetic_result import read_records

            return read_records(self.file_data)  # the synthetic records themselves
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "pandas is needed for DataFrames: pip install pandas (or install the client with its 'pandas' extra)"
            ) from exc
        out = self.output
        kind = out.get("type")
        if kind == "table":
            return _table_frame(pd, out)
        if kind == "regression":
            frame = pd.DataFrame(out["coefficients"]).set_index("term")
            # The fit travels with the coefficients: n, residual and model df, R² and the rest.
            frame.attrs.update(
                {"n": out["n"], "df_resid": out["df_resid"], "df_model": out["df_model"]}
            )
            frame.attrs.update(out.get("fit") or {})
            return frame
        if kind == "test":
            row = {k: out[k] for k in ("test", "statistic", "df", "p_value", "n")}
            return pd.DataFrame([{**row, **(out.get("details") or {})}])
        if kind == "model":
            metrics = {**out["metrics"], "n_train": out["n_train"], "n_test": out["n_test"]}
            return pd.DataFrame({"value": metrics}).rename_axis("metric")
        if kind == "script":
            return _script_frame(pd, out)
        if kind == "survival":
            return _survival_frame(pd, out)
        if kind == "dp_answer" and out["kind"] == "dp_mean_test" and out.get("test"):
            return pd.DataFrame([out["test"]])
        if kind == "correlation":
            return pd.DataFrame(out["matrix"], index=out["variables"], columns=out["variables"])
        if kind == "dp_answer" and out["kind"] == "dp_mean":
            rows = DPResult(out).means()
            frame = pd.DataFrame(rows)
            for i, name in enumerate(out["by"]):
                frame.insert(i, name, [r["group"][i] for r in rows])
            return frame.drop(columns="group")
        if kind == "dp_answer":
            dp = DPResult(out)
            index = _labels(out["groups"], out["by"], pd)
            est, se = dp.estimates(), dp.standard_errors()
            return pd.DataFrame(
                {
                    **{f"{c}": [row[i] for row in est] for i, c in enumerate(out["components"])},
                    **{f"se {c}": [row[i] for row in se] for i, c in enumerate(out["components"])},
                },
                index=index,
            )
        if kind == "summary":
            rows = []
            for group in out["groups"]:
                for var in group["variables"]:
                    row = dict(zip(out["by"], group["labels"], strict=False))
                    row.update({"variable": var["variable"], "n": var["n"], **var["stats"]})
                    # n suppressed with the missing count it would give back (issue 41)
                    row["n_suppressed"] = bool(var.get("n_suppressed"))
                    row["missing"] = _summary_missing(out, var["variable"], group["labels"])
                    rows.append(row)
            return pd.DataFrame(rows)
        return None

    def plot(self, ax: Any = None) -> Any:
        """Draw the released output with matplotlib (optional; see
        `safeaccess.client.plots`) on `ax` or a new figure; returns the axes."""
        from safeaccess.client.plots import plot_result

        return plot_result(self, ax)

    def _repr_html_(self) -> str:
        from safeaccess.client.notebook import step_html

        return step_html(self)

    def describe(self) -> str:
        """A short human account of this step's outcome."""
        what = self.kind or "analysis"
        on = f" on {self.dataset_label}" if self.dataset_label else ""
        head = f"step {self.index} ({what}): {self.status.upper()}{on}"
        lines = [head]
        if self.withheld or self.in_review or self.awaiting_approval:
            lines += [f"  - {reason}" for reason in self.reasons]
        dp = self.dp
        if dp is not None:
            lines += ["  " + line for line in dp.describe().splitlines()]
        if self.failed:
            lines.append(f"  - {self.error_code}: {self.error_message}")
        if self.review_note:
            lines.append(f"  - output checker: {self.review_note}")
        if self.withhold_budget is not None:
            lines.append(f"  ({self.withhold_budget})")
        return "\n".join(lines)


def _summary_missing(out: dict[str, Any], variable: str, labels: list[Any]) -> int | None:
    """A summary's released count of `variable`'s missing values in the group `labels` (None:
    suppressed, or not reported)."""
    for m in out.get("missing") or []:
        if m["variables"] == [variable] and list(m.get("group") or []) == list(labels):
            count: int | None = m.get("count")
            return count
    return None


class ReceiptInvalid(Exception):
    """A step's receipt is missing, forged, or does not match what was received or sealed."""

    code = "receipt_invalid"


FINAL_STATES = frozenset({"released", "withheld", "failed"})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _opens(fields: dict[str, Any], output: Any) -> bool:
    """Whether the receipt's opening (salt) opens its commitment to `output`."""
    try:
        salt = bytes.fromhex(str(fields.get("output_opening")))
    except ValueError:
        return False
    return opens(str(fields.get("output_commitment")), salt, output)


def verify_receipt(
    result: StepResult, server_key: Ed25519PublicKey, sealed: SealedSequence | None = None
) -> None:
    """Check the centre's signed receipt for a step in a final state, or raise ReceiptInvalid.

    The receipt must verify with `server_key` and state exactly this step's outcome: sequence,
    index, state, the output received (its salted commitment, opened by the receipt) and, given the sealed
    sequence, the header, trace and body that were revealed.
    """
    if result.status not in FINAL_STATES:
        raise ReceiptInvalid(f"step {result.index} is {result.status}; it has no receipt yet")
    receipt = result.receipt
    if not isinstance(receipt, dict) or not isinstance(receipt.get("fields"), dict):
        raise ReceiptInvalid(f"step {result.index} came without a receipt")
    fields: dict[str, Any] = receipt["fields"]
    try:
        signature = base64.b64decode(str(receipt.get("signature", "")), validate=True)
        server_key.verify(signature, canonical.dumps(fields))
    except (binascii.Error, InvalidSignature, rfc8785.CanonicalizationError) as exc:
        raise ReceiptInvalid(
            f"the receipt of step {result.index} is not signed by the server's key"
        ) from exc
    expected: dict[str, Any] = {
        "protocol": "safeaccess-receipt",
        "sequence": result.sequence_id,
        "step": result.index,
        "state": result.status,
        "last": result.last,
    }
    if result.output is None:
        # A withheld step's receipt carries the log's commitment to the output she never
        # received, without its opening.
        expected["output_opening"] = None
    elif not _opens(fields, result.output):
        expected["output_commitment"] = "a commitment opened by the receipt's salt"
    if sealed is not None:
        trace, body = sealed.reveal_for(result.index)
        expected.update(
            header_sha256=_sha256(sealed.header),
            trace_sha256=_sha256(trace),
            body_sha256=_sha256(body),
            server=sealed.header_fields.server,
        )
    wrong = sorted(k for k, v in expected.items() if fields.get(k) != v)
    if wrong:
        raise ReceiptInvalid(
            f"the receipt of step {result.index} does not match what was received: "
            + ", ".join(wrong)
        )


def _labels(labels: list[list[Any]], names: list[str], pd: Any) -> Any:
    if not names:
        return None
    if len(names) == 1:
        return pd.Index([lab[0] if lab else None for lab in labels], name=names[0])
    return pd.MultiIndex.from_tuples([tuple(lab) for lab in labels], names=names)


def _table_frame(pd: Any, out: dict[str, Any]) -> Any:
    index = _labels(out["row_labels"], out["row_vars"], pd)
    columns = _labels(out["col_labels"], out["col_vars"], pd)
    if out.get("margins"):
        # The margin row/column label is ["All"], shorter than the other labels.
        index = _margin_index(pd, out["row_labels"], out["row_vars"])
        if out["col_vars"]:
            columns = _margin_index(pd, out["col_labels"], out["col_vars"])
    if columns is None:
        columns = [out.get("statistic", "value")]
    frame = pd.DataFrame(out["values"], index=index, columns=columns)
    if out.get("statistic") == "count":
        # Counts are whole numbers; nullable Int64 keeps suppressed cells as <NA>.
        frame = frame.round().astype("Int64")
    return frame


def _script_frame(pd: Any, out: dict[str, Any]) -> Any:
    """A script's `result` as a frame where it is tabular, else one cell; else its stdout."""
    result = out.get("result")
    if result is None:
        return pd.DataFrame({"stdout": [out.get("stdout", "")]})
    if isinstance(result, list) and all(isinstance(r, dict) for r in result):
        return pd.DataFrame(result)
    if isinstance(result, dict):
        try:
            return pd.DataFrame(result)
        except ValueError:  # scalars only: one row
            return pd.DataFrame([result])
    return pd.DataFrame({"result": result if isinstance(result, list) else [result]})


def _survival_frame(pd: Any, out: dict[str, Any]) -> Any:
    rows = []
    for curve in out["curves"]:
        labels = dict(zip(out.get("by", []), curve["labels"], strict=False))
        rows += [{**labels, **step} for step in curve["steps"]]
    return pd.DataFrame(rows)


def _margin_index(pd: Any, labels: list[list[Any]], names: list[str]) -> Any:
    width = len(names)
    padded = [tuple(lab) + ("",) * (width - len(lab)) for lab in labels]
    if width == 1:
        return pd.Index([p[0] for p in padded], name=names[0])
    return pd.MultiIndex.from_tuples(padded, names=names)


def format_output(result: StepResult) -> str:
    """The released output as text: a DataFrame rendering where pandas is available."""
    if result.output is None:
        return ""
    if result.output.get("type") == "script":
        # Everything a script gave (its printed output and its result), not only the result.
        import json

        return json.dumps(result.output, indent=2, sort_keys=True)
    try:
        frame = result.frame()
    except ImportError:
        frame = None
    if frame is not None:
        return str(frame.to_string())
    import json

    return json.dumps(result.output, indent=2, sort_keys=True)
