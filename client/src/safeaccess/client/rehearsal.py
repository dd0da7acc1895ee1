"""The report of a dry run: `plan.rehearse()` on a mock of the dataset built from its metadata.

The centre runs the plan on the mock with the same compute code and the same output rules as a
real step (nothing touches the data, nothing is logged or charged) and answers, per analysis,
what refuses it whatever the data and what its output rules said on the mock. A verdict on a mock
predicts nothing about the real one; the report says so first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from safeaccess.client.results import Reason


@dataclass(frozen=True)
class RehearsedStep:
    """One analysis of the rehearsal (`index` is 1-based, like the sequence's steps)."""

    index: int
    kind: str
    refused: tuple[str, ...]
    mock_verdict: str
    checks: tuple[Reason, ...]
    note: str | None

    @property
    def doomed(self) -> bool:
        """Refused by the analysis alone: it will not run whatever the data."""
        return bool(self.refused)

    def describe(self) -> str:
        head = f"step {self.index} ({self.kind}): "
        if self.refused:
            lines = [head + "REFUSED by the analysis alone (whatever the data)"]
            lines += [f"  - {r}" for r in self.refused]
            return "\n".join(lines)
        if self.mock_verdict == "not_rehearsed":
            return head + f"not rehearsed: {self.note}"
        lines = [head + f"on the mock: {self.mock_verdict.upper()}"]
        if self.mock_verdict == "release":
            lines.append("  - passed every output check on the mock")
        lines += [f"  - likely {r.verdict}: {r}" for r in self.checks]
        if self.note:
            lines.append(f"  - {self.note}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Rehearsal:
    """The whole dry run: the dataset, the mock, the disclaimer and one entry per analysis."""

    dataset: str
    rows: int
    mock_rows: int
    ruleset: str
    notes: tuple[str, ...]
    disclaimer: str
    steps: tuple[RehearsedStep, ...]
    # Rehearsed on this machine because the centre could not be reached (see
    # `Session.rehearse_offline`), and on which mock.
    offline: bool = False
    mock_source: str = "mock from the published metadata and row count"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rehearsal:
        return cls(
            dataset=f"{data['dataset']}@{data['version']}",
            rows=int(data["rows"]),
            mock_rows=int(data["mock_rows"]),
            ruleset=str(data["ruleset"]),
            notes=tuple(data["notes"]),
            disclaimer=str(data["disclaimer"]),
            steps=tuple(
                RehearsedStep(
                    index=int(s["index"]) + 1,
                    kind=str(s["kind"]),
                    refused=tuple(s["refused"]),
                    mock_verdict=str(s["mock_verdict"]),
                    checks=tuple(
                        Reason(
                            check=r["check"],
                            verdict=r["verdict"],
                            item=r.get("item"),
                            message=r["message"],
                        )
                        for r in s["checks"]
                    ),
                    note=s.get("note"),
                )
                for s in data["steps"]
            ),
            offline=bool(data.get("offline", False)),
            mock_source=str(
                data.get("mock_source", "mock from the published metadata and row count")
            ),
        )

    def _repr_html_(self) -> str:
        from safeaccess.client.notebook import rehearsal_html

        return rehearsal_html(self)

    @property
    def doomed(self) -> tuple[RehearsedStep, ...]:
        """The steps refused by the analysis alone."""
        return tuple(s for s in self.steps if s.doomed)

    def __str__(self) -> str:
        lines = [
            f"rehearsal of {len(self.steps)} analyses on a mock of {self.dataset} "
            f"({self.mock_rows} mock rows for {self.rows} real ones; rules {self.ruleset})",
            f"NOTE: {self.disclaimer}",
        ]
        if self.offline:
            lines.insert(
                1,
                f"OFFLINE: the centre could not be reached; rehearsed on this machine on the "
                f"{self.mock_source}, with the catalogue and rules cached at the last "
                "connection. DP requests meet your DP budget only when you seal.",
            )
        lines += [f"  mock: {n}" for n in self.notes]
        lines += [s.describe() for s in self.steps]
        return "\n".join(lines)


__all__ = ["Rehearsal", "RehearsedStep"]
