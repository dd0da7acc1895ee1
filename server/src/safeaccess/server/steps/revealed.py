"""A revealed step as the server uses it: the verified trace and body, parsed once.

The body of a step is read by several stops of one step (the endorsement-claims gate, the
script queue, the query-set auditor, the pipeline, the step's view). Each used to parse the
bytes again; `Revealed` parses them once, right after `SequenceVerifier.reveal` has checked
them against the sealed header, and every stop reads its fields.

The bytes are decoded once, by the JSON parser pydantic's own `validate_json` uses
(`pydantic_core.from_json`), and the analysis is validated from that value, so a body is
accepted or refused exactly as `parse_analysis(body)` would. A body that fails is validated from
its bytes once more, only to give the researcher the very error (JSON-mode wording) the pipeline
always gave: the failure path, never a second parse of an accepted body.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pydantic_core
from pydantic import ValidationError

from safeaccess.client.analyses import Analysis, parse_analysis

#: The kind of a script step (run in the background, see `scripts.py`).
SCRIPT_KIND = "script"


@dataclass(frozen=True)
class Revealed:
    """One step's verified trace and body, with the body parsed.

    `document` is the body as a JSON value (None if it is not JSON); `analysis` the validated
    analysis, or None with `error` saying why; `kind` the analysis kind of a valid body."""

    trace: bytes
    body: bytes
    last: bool
    document: Any
    analysis: Analysis | None
    error: ValidationError | None

    @classmethod
    def of(cls, trace: bytes, body: bytes, *, last: bool) -> Revealed:
        """Parse `body` (already verified against its trace): once, whatever it holds."""
        try:
            document: Any = pydantic_core.from_json(body)
        except ValueError:
            document = None
        analysis: Analysis | None = None
        error: ValidationError | None = None
        if isinstance(document, dict):
            with contextlib.suppress(ValidationError):
                analysis = parse_analysis(document)
        if analysis is None:
            # The failure path only: validating the bytes gives the researcher the very error
            # (JSON-mode wording) the pipeline always gave.
            try:
                analysis = parse_analysis(body)
            except ValidationError as exc:
                error = exc
        return cls(
            trace=trace, body=body, last=last, document=document, analysis=analysis, error=error
        )

    @classmethod
    def stored(cls, body: bytes, *, last: bool) -> Revealed:
        """A step read back from the store (its trace is not kept with it, only its hash)."""
        return cls.of(b"", body, last=last)

    @property
    def kind(self) -> str | None:
        """The analysis kind, or None for a body that is not a valid analysis."""
        return None if self.analysis is None else self.analysis.kind

    @property
    def is_script(self) -> bool:
        """Whether the step is a script (invalid bodies are not: they fail as usual)."""
        return self.kind == SCRIPT_KIND

    @property
    def shown(self) -> dict[str, Any] | None:
        """The analysis as a step's view shows it: the body's JSON object, or None."""
        return self.document if isinstance(self.document, dict) else None

    @cached_property
    def analysis_json(self) -> dict[str, Any] | None:
        """The validated analysis as JSON (the query-set auditor keeps it to re-evaluate the
        step's query sets on its domain grid), or None for an invalid body."""
        return None if self.analysis is None else self.analysis.model_dump(mode="json")


def shown_of(body: bytes) -> dict[str, Any] | None:
    """A stored step's analysis as its view shows it: the body's JSON object, or None (the
    same parser as `Revealed.of`, so a step reads the same before and after it is stored)."""
    try:
        document = pydantic_core.from_json(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None
