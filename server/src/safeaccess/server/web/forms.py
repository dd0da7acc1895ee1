"""The workspace's forms, as FastAPI reads them (`Annotated[Form, Form()]`): a field the browser
does not send is empty, and every form carries the session's CSRF token."""

from __future__ import annotations

from pydantic import BaseModel


class CsrfForm(BaseModel):
    csrf_token: str = ""


class DecisionForm(CsrfForm):
    """A decision on an opening past the withhold budget, or on a step."""

    action: str = ""  # approve or reject
    comment: str = ""


class StepDecisionForm(DecisionForm):
    """A step's decision: an approval may also suppress small cells or round the table."""

    suppress: str = ""
    round_to: str = ""


class CredentialsForm(CsrfForm):
    password: str = ""
    code: str = ""  # the authenticator app's current code


class EnrolForm(CredentialsForm):
    token: str = ""  # the enrolment link's
    confirm: str = ""


class LoginForm(CredentialsForm):
    name: str = ""
