"""What a notebook card reads of the thing it shows, and the HTML a card is made of.

The client's cards (`notebook.py`) read plans, step results, DP answers, models and rehearsals
through the small protocols below instead of importing those types, and the protocol package
draws the sealed sequence's card with the helpers here: every module that has a card imports the
renderer, never the other way, so the client's modules depend one way. This module imports
nothing of the client.

Plain HTML with inline styles (notebooks strip stylesheets and scripts), every value escaped.
Each card carries a `data-safeaccess` attribute naming what it shows, and each verdict badge a
`data-status`, so a page can be checked by machine.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

_COLOURS = {
    "released": "#1b7f3b",
    "withheld": "#b3261e",
    "failed": "#b3261e",
    "review": "#9a6700",
    "pending": "#9a6700",
    "release": "#1b7f3b",
    "withhold": "#b3261e",
    "refused": "#b3261e",
    "running": "#3b5bdb",
}
_CARD = (
    "border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;margin:6px 0;"
    "font-family:system-ui,sans-serif;font-size:13px"
)
MAX_ROWS = 30


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def badge(status: str) -> str:
    colour = _COLOURS.get(status, "#57606a")
    return (
        f'<span data-status="{esc(status)}" style="background:{colour};color:#fff;'
        f'border-radius:10px;padding:1px 8px;font-size:11px;font-weight:600">'
        f"{esc(status.upper())}</span>"
    )


def card(what: str, title: str, body: str) -> str:
    return (
        f'<div data-safeaccess="{esc(what)}" style="{_CARD}">'
        f'<div style="font-weight:600;margin-bottom:4px">{title}</div>{body}</div>'
    )


def rows(pairs: Sequence[tuple[str, object]]) -> str:
    """Label/value pairs as a two-column table."""
    cells = "".join(
        f'<tr><th style="text-align:left;padding-right:12px">{esc(k)}</th><td>{esc(v)}</td></tr>'
        for k, v in pairs
    )
    return f"<table>{cells}</table>"


def json_block(data: Any) -> str:
    text = json.dumps(data, indent=1, sort_keys=True, default=str)
    if len(text) > 4000:
        text = text[:4000] + "\n..."
    return f'<pre style="max-height:20em;overflow:auto">{esc(text)}</pre>'


def frame_html(frame: Any) -> str:
    """A DataFrame as HTML (pandas escapes the values), at most MAX_ROWS rows."""
    text: str = frame.to_html(max_rows=MAX_ROWS, border=0)
    return text


# --------------------------------------------------------------- what each card reads (protocols)


class AnalysisCard(Protocol):
    """One analysis of a plan (`safeaccess.client.analyses`)."""

    @property
    def kind(self) -> str: ...

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


class PlanCard(Protocol):
    """A plan (`safeaccess.client.plan.Plan`): its dataset and analyses in order."""

    @property
    def dataset(self) -> str: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[AnalysisCard]: ...


class DPCard(Protocol):
    """A released DP answer (`safeaccess.client.dpresult.DPResult`)."""

    @property
    def kind(self) -> str: ...

    @property
    def components(self) -> list[str]: ...

    @property
    def groups(self) -> list[list[Any]]: ...

    def estimates(self) -> list[list[float]]: ...

    def standard_errors(self) -> list[list[float]]: ...

    def means(self) -> list[dict[str, Any]]: ...

    def describe(self) -> str: ...


class StepCard(Protocol):
    """A step's result (`safeaccess.client.results.StepResult`)."""

    @property
    def sequence_id(self) -> str: ...

    @property
    def index(self) -> int: ...

    @property
    def kind(self) -> str | None: ...

    @property
    def status(self) -> str: ...

    @property
    def output(self) -> dict[str, Any] | None: ...

    @property
    def reasons(self) -> Sequence[object]: ...

    @property
    def error_code(self) -> str | None: ...

    @property
    def error_message(self) -> str | None: ...

    @property
    def review_note(self) -> str | None: ...

    @property
    def withhold_budget(self) -> object | None: ...

    @property
    def file_data(self) -> bytes | None: ...

    @property
    def dataset_label(self) -> str | None: ...

    @property
    def released(self) -> bool: ...

    @property
    def failed(self) -> bool: ...

    @property
    def dp(self) -> DPCard | None: ...

    def frame(self) -> Any: ...


class ModelCard(Protocol):
    """A released model (`safeaccess.client.models.Predictor`)."""

    @property
    def output(self) -> Any: ...

    @property
    def classes(self) -> list[Any]: ...


class RehearsedStepCard(Protocol):
    """One analysis of a rehearsal (`safeaccess.client.rehearsal.RehearsedStep`)."""

    @property
    def index(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def refused(self) -> Sequence[str]: ...

    @property
    def mock_verdict(self) -> str: ...

    @property
    def checks(self) -> Sequence[object]: ...

    @property
    def note(self) -> str | None: ...


class RehearsalCard(Protocol):
    """A rehearsal (`safeaccess.client.rehearsal.Rehearsal`)."""

    @property
    def dataset(self) -> str: ...

    @property
    def mock_rows(self) -> int: ...

    @property
    def ruleset(self) -> str: ...

    @property
    def notes(self) -> Sequence[str]: ...

    @property
    def disclaimer(self) -> str: ...

    @property
    def steps(self) -> Sequence[RehearsedStepCard]: ...

    @property
    def offline(self) -> bool: ...

    @property
    def mock_source(self) -> str: ...


__all__ = [
    "MAX_ROWS",
    "AnalysisCard",
    "DPCard",
    "ModelCard",
    "PlanCard",
    "RehearsalCard",
    "RehearsedStepCard",
    "StepCard",
    "badge",
    "card",
    "esc",
    "frame_html",
    "json_block",
    "rows",
]
