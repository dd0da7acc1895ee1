"""A researcher's session with a safeaccess server: signed requests and tit-for-tat driving.

`connect(url, key, researcher)` returns a `Session`; `session.run(sealed)` opens the sequence,
waits for each result and reveals the next trace only after a release. It stops at a withhold,
a failure, or a step still in review when the review timeout passes. Every request is signed with
the researcher's Ed25519 key (`safeaccess.client.httpsig`); no password exists.

Reveals are idempotent on the server, so after a lost connection or a server restart the session
re-sends the same reveal, and `run` on a sequence already opened resumes where it stopped.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import ssl
import time
from collections.abc import Callable, Generator
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from safeaccess.client.budgets import Budgets, DPBudget
from safeaccess.client.centre_cache import CentreCache
from safeaccess.client.httpsig import sign_request
from safeaccess.client.journal import Journal, JournalEntry
from safeaccess.client.keyrotation import KeyStatus
from safeaccess.client.keys import (
    fingerprint,
    load_private_key,
    public_key_from_raw,
    public_key_raw,
)
from safeaccess.client.metadata import Column, DatasetMetadata, NeighbouringRelation, split_dataset
from safeaccess.client.plan import Plan
from safeaccess.client.protocol.errors import ProtocolError
from safeaccess.client.protocol.sealed import SealedSequence
from safeaccess.client.protocol.verify import verify_whole
from safeaccess.client.rehearsal import Rehearsal
from safeaccess.client.results import FINAL_STATES, ReceiptInvalid, StepResult, verify_receipt
from safeaccess.client.results_folder import Results
from safeaccess.client.validation import AnalysisInvalid, Problem

if TYPE_CHECKING:
    import pandas as pd

    from safeaccess.client.synthetic_result import SyntheticDataResult


class SessionError(Exception):
    """The session could not complete a request; `code` is machine-readable."""

    code = "session_error"


class ServerError(SessionError):
    """The server refused a request with {"error": {"code", "message"}}."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{message} ({code}, HTTP {status})")
        self.status = status
        self.code = code
        self.message = message


class KeyReplaced(ServerError):
    """The centre's log says this researcher's key was replaced: by her own signed rotation, or
    by the centre's revocation (which she must check she asked for)."""


class Unreachable(SessionError):
    """No answer from the server: refused, timed out, unknown host, broken connection."""

    code = "unreachable"

    def __init__(self, url: str, exc: httpx.TransportError):
        super().__init__(f"cannot reach {url}: {transport_reason(exc)}")
        self.url = url


def transport_reason(exc: httpx.TransportError) -> str:
    """A few words for why a connection failed (no traceback, no library internals)."""
    text = str(exc).lower()
    if "refused" in text:
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if "name or service not known" in text or "nodename nor servname" in text:
        return "unknown host name"
    if "certificate" in text or "ssl" in text:
        return f"TLS failed ({exc})"
    return str(exc) or type(exc).__name__


class WrongServer(SessionError):
    code = "wrong_server"


class TamperedSequence(SessionError):
    """The sealed file does not verify as a whole (signature, T_0 or the hash chain)."""

    code = "sealed_file_invalid"


class UnknownDataset(SessionError):
    """The catalogue lists no dataset (or no such version) under the name asked for."""

    code = "unknown_dataset"


class OfflineUnavailable(SessionError):
    """The centre cannot be reached and the client cannot rehearse without it (nothing cached,
    or the sandbox and rules packages not installed); the message says which."""

    code = "offline_unavailable"


class NotInJournal(SessionError):
    """`resume` asked for a sequence whose sealed file this client did not keep."""

    code = "not_in_journal"


#: Sequence states in which nothing more can be revealed.
CLOSED_STATES = ("finished", "aborted")


class BadReceipt(SessionError):
    """The server's receipt for a step did not verify; nothing more is revealed."""

    code = "receipt_invalid"


def tls_verify(ca_bundle: Path | str | None) -> ssl.SSLContext | bool:
    """What httpx checks a server's certificate against: the system's default trust store, or,
    given `ca_bundle` (a PEM file of CA certificates), those CAs only. A centre whose TLS
    certificate comes from its own CA hands researchers and auditors that CA's certificate."""
    if ca_bundle is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(Path(ca_bundle).expanduser()))
    except (OSError, ssl.SSLError) as exc:
        # An OSError, like the file errors the command line already reports as user errors.
        raise OSError(f"cannot read the CA bundle {ca_bundle}: {exc}") from None


class _Signer(httpx.Auth):
    """Signs every request, tagged with the server's id (learnt from /v1/health before the first
    signed request) so that no other centre accepts a copy of it."""

    requires_request_body = True
    requires_response_body = True

    def __init__(self, key: Ed25519PrivateKey, researcher: str, health_url: str):
        self._key = key
        self._researcher = researcher
        self._health_url = health_url
        self.server: str | None = None

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self.server is None and str(request.url) != self._health_url:
            health = yield httpx.Request("GET", self._health_url)
            with contextlib.suppress(ValueError, KeyError, TypeError):
                if health.status_code == 200:
                    self.server = str(health.json()["server_id"])
        request.headers.update(
            sign_request(
                request.method,
                request.url.path,
                request.url.query.decode("ascii"),
                request.content,
                self._key,
                self._researcher,
                server=self.server,
            )
        )
        yield request


class Session:
    """Signed access to one server for one researcher."""

    def __init__(
        self,
        url: str,
        key: Ed25519PrivateKey,
        researcher: str,
        *,
        timeout: float = 600.0,
        retries: int = 5,
        retry_wait: float = 1.0,
        server_key: Ed25519PublicKey | None = None,
        ca_bundle: Path | str | None = None,
        journal: Journal | bool = True,
    ):
        self.url = url.rstrip("/")
        # Every sealed sequence run is kept here (0600) so it can be resumed; False: none kept.
        self.journal: Journal | None = (
            Journal() if journal is True else (journal if isinstance(journal, Journal) else None)
        )
        self.server_key = server_key
        self.researcher = researcher
        self._key = key
        self.retries = retries
        self.retry_wait = retry_wait
        self._reached = False
        self._verify = tls_verify(ca_bundle)
        # The catalogue, rules, key and mocks of this centre, for rehearsing offline.
        self.cache = CentreCache(self.url)
        self._http = httpx.Client(
            base_url=self.url,
            auth=_Signer(key, researcher, self.url + "/v1/health"),
            timeout=timeout,
            verify=self._verify,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise Unreachable(self.url, exc) from None
        self._reached = True
        if response.status_code == 401:
            self._flag_replaced_key()
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise ServerError(response.status_code, error["code"], error["message"])
            except (ValueError, KeyError, TypeError):
                raise ServerError(response.status_code, "http_error", response.text[:500]) from None
        return response.json()

    def _flag_replaced_key(self) -> None:
        """After an authentication failure: if the centre's log says this key was replaced,
        say so, loudly for a revocation (the centre changed her key without her signature)."""
        try:
            answer = httpx.get(
                f"{self.url}/v1/keys/{fingerprint(self._key)}", timeout=30, verify=self._verify
            )
            status = KeyStatus.model_validate(answer.json()) if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return  # the lookup is a courtesy; the authentication failure is reported anyway
        if status is None or status.status not in ("rotated", "revoked", "removed"):
            return
        if status.status == "removed":
            message = (
                f"WARNING: the centre REMOVED the account of your key "
                f"{fingerprint(self._key)[:16]}... (audit log entry {status.entry}); your "
                "researcher name may now be registered with another key. If you did not ask "
                "for this, report it"
            )
        elif status.status == "rotated":
            message = (
                f"your key {fingerprint(self._key)[:16]}... was rotated (audit log entry "
                f"{status.entry}, signed by this key) to key {str(status.replaced_by)[:16]}...; "
                "sign in with your new key"
            )
        else:
            message = (
                f"WARNING: the centre REVOKED your key {fingerprint(self._key)[:16]}... and "
                f"registered key {str(status.replaced_by)[:16]}... in your name without your "
                f"signature (audit log entry {status.entry}, reason: {status.reason!r}). If you "
                "did not ask for this, report it: sequences signed in your name since then "
                "are not yours"
            )
        raise KeyReplaced(401, f"key_{status.status}", message)

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """Call, retrying transport failures, 502/503/504s and lost races with a concurrent
        request on the same sequence (safe: these calls are idempotent)."""
        for attempt in range(self.retries + 1):
            try:
                return call()
            except Unreachable:
                # Worth waiting for once the server answered (a restart mid-run); a server never
                # reached is reported at once (a wrong URL, or it is down).
                if attempt == self.retries or not self._reached:
                    raise
            except ServerError as exc:
                # 502 and 504 come from a load balancer whose replica died or stalled under the
                # request: another replica answers the repeated call.
                transient = exc.status in (502, 503, 504) or exc.code == "concurrent_update"
                if not transient or attempt == self.retries:
                    raise
            time.sleep(self.retry_wait * (attempt + 1))
        raise AssertionError("unreachable")

    # -- reads ----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The server's id, key fingerprint and sandbox (unauthenticated)."""
        result: dict[str, Any] = self._retrying(lambda: self._request("GET", "/v1/health"))
        self.cache.save_health(result)
        return result

    def datasets(self) -> list[dict[str, Any]]:
        """The catalogue of datasets you may analyse: names, descriptions, column metadata."""
        data = self._retrying(lambda: self._request("GET", "/v1/datasets"))
        self.cache.save_catalogue(list(data["datasets"]))
        return list(data["datasets"])

    def catalogue_entry(self, dataset: str) -> dict[str, Any]:
        """The catalogue entry of `dataset`: 'name@version', or the newest version of 'name'."""
        name, version = split_dataset(dataset)
        entries = [d for d in self.datasets() if d["name"] == name]
        if version is not None:
            entries = [d for d in entries if int(d["version"]) == version]
        if not entries:
            listed = sorted({f"{d['name']}@{d['version']}" for d in self.datasets()})
            raise UnknownDataset(
                f"the catalogue has no dataset {dataset!r} you may analyse; it lists "
                f"{', '.join(listed) or 'nothing for you'}"
            )
        return max(entries, key=lambda d: int(d["version"]))

    def metadata(self, dataset: str) -> DatasetMetadata:
        """The published metadata of `dataset` ('name@version', or the newest 'name')."""
        return _metadata_of(self.catalogue_entry(dataset))

    def plan(self, dataset: str) -> Plan:
        """A plan on `dataset` with its metadata from the catalogue, so every analysis added is
        checked against it at once.

        `census@2` pins that version; a bare `census` is pinned to the newest version the
        catalogue lists now, the one whose metadata the plan is checked against.
        """
        entry = self.catalogue_entry(dataset)
        metadata = _metadata_of(entry)
        self._cache_mock(entry)
        plan = Plan(metadata.label, metadata)
        plan.session = self  # so that plan.rehearse() knows where to ask
        return plan

    def _cache_mock(self, entry: dict[str, Any]) -> None:
        """Keep the version's published DP mock for rehearsing offline, once (the centre serves
        the newest version's mock only: an older version's is not fetched)."""
        published = entry.get("mock")
        if not published or self.cache.mock(entry["name"], published["manifest"]["sha256"]):
            return
        from safeaccess.client.mock import MockInvalid

        newest = self.cache.entry(entry["name"])
        if newest is not None and int(newest["version"]) == int(entry["version"]):
            # Planning does not depend on the mock: one that cannot be fetched or does not
            # verify is not kept, and an offline rehearsal then says it never had it.
            with contextlib.suppress(ServerError, MockInvalid):
                self._mock_payload(entry["name"])

    def rehearse(self, plan: Plan) -> Rehearsal:
        """Dry-run `plan` on a mock of its dataset built from the metadata (declared levels,
        bounds, row count), with the same compute code and output rules as a real step: per
        analysis, what refuses it whatever the data and what the rules said on the mock. The
        centre touches no data and logs or charges nothing. A mock predicts nothing about the
        real verdicts."""
        if not self._http.is_closed:
            name, version = split_dataset(plan.dataset)
            body = {"version": version, "analyses": [a.model_dump(mode="json") for a in plan]}
            try:
                return Rehearsal.from_json(
                    self._retrying(
                        lambda: self._request("POST", f"/v1/datasets/{name}/rehearse", body)
                    )
                )
            except Unreachable:
                pass
        return self.rehearse_offline(plan)

    def rehearse_offline(self, plan: Plan) -> Rehearsal:
        """Rehearse `plan` here, without the centre, with what the last connection cached: the
        same checks as the centre's rehearsal, on the version's published DP mock when one was
        fetched (`plan()` fetches it), else on the mock drawn from the metadata and row count.
        Needs safeaccess-sandbox and safeaccess-rules installed; the DP budget is checked only
        when sealing."""
        import importlib

        from safeaccess.client.mock import mock_frame, verify_mock

        entry = self.cache.entry(plan.dataset)
        if entry is None:
            raise OfflineUnavailable(
                f"the centre at {self.url} cannot be reached and this client has cached no "
                f"catalogue entry for {plan.dataset}; connect once while it is reachable"
            )
        try:
            # optional: the client distribution does not depend on the sandbox's
            offline = importlib.import_module("safeaccess.sandbox.mock.offline")
        except ImportError:
            raise OfflineUnavailable(
                "rehearsing without the centre runs its checks here: install safeaccess-sandbox "
                "and safeaccess-rules (pip install './sandbox' './rules')"
            ) from None
        frame = None
        published = entry.get("mock")
        payload = (
            self.cache.mock(entry["name"], published["manifest"]["sha256"]) if published else None
        )
        health = self.cache.health()
        if payload is not None and (self.server_key is not None or health is not None):
            key = self.server_key or public_key_from_raw(
                base64.b64decode(str(health["server_public_key"]) if health else "")
            )
            frame = mock_frame(*verify_mock(payload, key))
        report: dict[str, Any] = offline.rehearse_offline(list(plan), entry, frame)
        if published and frame is None:
            report["notes"].append(
                "the published DP mock was never fetched by this client; rehearsed on a mock "
                "drawn from the metadata instead"
            )
        return Rehearsal.from_json(report)

    def budgets(self, dataset: str) -> Budgets:
        """Your remaining DP budget and withhold budget on `dataset`, from the catalogue."""
        return Budgets.from_catalogue(self.catalogue_entry(dataset))

    def check_plan(self, plan: Plan) -> DPBudget | None:
        """Ask the server what the plan's analyses alone doom, whatever the data: a DP request
        the remaining budget (with the plan's earlier DP requests counted) cannot cover or the
        controller's risk limit forbids, a kind the dataset's DP setting refuses. Raises
        `AnalysisInvalid` naming each; otherwise returns the DP budget that would remain after
        the plan (None without DP). Nothing runs and nothing is charged."""
        name, version = split_dataset(plan.dataset)
        body = {"version": version, "analyses": [a.model_dump(mode="json") for a in plan]}
        data = self._retrying(
            lambda: self._request("POST", f"/v1/datasets/{name}/plan-check", body)
        )
        problems = [
            Problem(f"analyses[{p['index']}]", f"{p['kind']}: {p['message']}")
            for p in data["problems"]
        ]
        if problems:
            raise AnalysisInvalid(problems)
        after = data.get("dp_budget_after")
        return DPBudget.from_json(after) if after else None

    def seal(
        self,
        plan: Plan,
        key: Ed25519PrivateKey | None = None,
        *,
        expires: datetime | timedelta | None = None,
        declare_kinds: bool = False,
    ) -> SealedSequence:
        """Seal `plan` for this server: the researcher is this session's, the project the one
        the catalogue files the dataset under, the server id the one this server announces.

        `key` defaults to the session's signing key (the researcher's own). `declare_kinds`
        lists the plan's analysis kinds in the signed header (see `Plan.seal`). The plan is
        first checked by `check_plan`: a plan doomed by its analyses alone is not sealed.
        """
        self.check_plan(plan)
        entry = self.catalogue_entry(plan.dataset)
        server = str(self.health()["server_id"])
        return plan.seal(
            key or self._key,
            researcher=self.researcher,
            project=str(entry["project"]),
            server=server,
            expires=expires,
            declare_kinds=declare_kinds,
        )

    def sequences(self) -> list[dict[str, Any]]:
        """Your sequences, each with the state of its steps; `resumable` says whether
        `resume(id)` can continue it (still open at the centre and its sealed sequence kept in
        this client's journal, at `journal`)."""
        data = self._retrying(lambda: self._request("GET", "/v1/sequences"))
        listed = []
        for sequence in data["sequences"]:
            entry = self.journal.by_digest(sequence["header_sha256"]) if self.journal else None
            listed.append(
                {
                    **sequence,
                    "journal": str(entry.path) if entry is not None else None,
                    "resumable": entry is not None and sequence["state"] not in CLOSED_STATES,
                }
            )
        return listed

    def resume(self, sequence_id: str, **options: Any) -> Results:
        """Continue sequence `sequence_id` from this client's journal of sealed sequences: the
        steps already decided are returned, and the remaining ones are revealed as by `run`
        (which takes the same `options`: review_timeout, on_step, progress, ...)."""
        return self.run(self.journal_entry(sequence_id).sealed, **options)

    def journal_entry(self, sequence_id: str) -> JournalEntry:
        """The journal's entry for `sequence_id` (raises `NotInJournal` if it has none)."""
        entry = None
        if self.journal is not None:
            entry = next((e for e in self.journal.entries() if e.sequence_id == sequence_id), None)
            if entry is None:
                digest = self.sequence(sequence_id)["header_sha256"]
                entry = self.journal.by_digest(digest)
        if entry is None:
            where = self.journal.directory if self.journal is not None else "(journal off)"
            raise NotInJournal(
                f"sequence {sequence_id} is not in the journal of sealed sequences {where}; "
                "run its sealed file with `safeaccess run FILE`"
            )
        return entry

    def sequence(self, sequence_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._retrying(
            lambda: self._request("GET", f"/v1/sequences/{sequence_id}")
        )
        return result

    def step(self, sequence_id: str, index: int) -> StepResult:
        return StepResult.from_json(
            self._retrying(
                lambda: self._request("GET", f"/v1/sequences/{sequence_id}/steps/{index}")
            )
        )

    def step_file(self, result: StepResult) -> bytes:
        """The released file of a step (synthetic data), checked against the SHA-256 in its
        output (which the signed receipt commits to)."""
        from safeaccess.client.synthetic_result import check_file

        if result.output is None or "file" not in result.output:
            raise ValueError(f"step {result.index} has no released file")
        path = f"/v1/sequences/{result.sequence_id}/steps/{result.index}/file"

        def get() -> bytes:
            try:
                response = self._http.request("GET", path)
            except httpx.TransportError as exc:
                raise Unreachable(self.url, exc) from None
            if response.status_code >= 400:
                self._request("GET", path)  # raises the server's error
            return response.content

        data: bytes = self._retrying(get)
        return check_file(result.output, data)

    def synthetic(self, result: StepResult) -> SyntheticDataResult:
        """A released `synthetic_data` step with its file (`.frame()` for a DataFrame)."""
        from safeaccess.client.synthetic_result import SyntheticDataResult

        return SyntheticDataResult(output=dict(result.output or {}), data=self.step_file(result))

    def centre_key(self) -> Ed25519PublicKey:
        """The centre's signing key: the pinned one, checked against what the server announces,
        or (trust on first use within this session) the announced one."""
        announced = public_key_from_raw(base64.b64decode(self.health()["server_public_key"]))
        if self.server_key is None:
            self.server_key = announced
        elif public_key_raw(self.server_key) != public_key_raw(announced):
            raise WrongServer(f"{self.url} announces a different signing key than the pinned one")
        return self.server_key

    def mock(self, dataset: str) -> pd.DataFrame:
        """The dataset's published DP mock as a DataFrame, its signature and hash checked
        (`frame.attrs['safeaccess_mock']` holds the manifest). For writing and rehearsing
        sequences: results on it predict nothing about the real data's results or verdicts."""
        from safeaccess.client.mock import mock_frame, verify_mock

        return mock_frame(*verify_mock(self._mock_payload(dataset), self.centre_key()))

    def _mock_payload(self, dataset: str) -> dict[str, Any]:
        """The published mock's answer, its signature and hash checked, kept for offline use."""
        from safeaccess.client.mock import verify_mock

        payload: dict[str, Any] = self._retrying(
            lambda: self._request("GET", f"/v1/datasets/{dataset}/mock")
        )
        verify_mock(payload, self.centre_key())
        self.cache.save_mock(dataset, payload)  # for rehearsing offline
        return payload

    # -- the protocol ---------------------------------------------------------------------------

    def open(self, sealed: SealedSequence) -> StepResult:
        """Send the signed header, endorsements and the reveal of step 1; returns step 1."""
        trace, body = sealed.reveal_for(1)
        payload = {
            "header": _b64(sealed.header),
            "signature": _b64(sealed.signature),
            "endorsements": [e.model_dump(mode="json") for e in sealed.endorsements],
            "trace": trace.hex(),
            "body": _b64(body),
        }
        return StepResult.from_json(self._request("POST", "/v1/sequences", payload))

    def reveal(self, sequence_id: str, sealed: SealedSequence, index: int) -> StepResult:
        """Reveal step `index` (T_j, i_j); repeating it is harmless (the server answers again)."""
        trace, body = sealed.reveal_for(index)
        payload = {"trace": trace.hex(), "body": _b64(body)}
        path = f"/v1/sequences/{sequence_id}/steps/{index}"
        return StepResult.from_json(self._retrying(lambda: self._request("POST", path, payload)))

    def find(self, sealed: SealedSequence) -> dict[str, Any] | None:
        """The server's record of this sealed sequence, if it was already opened."""
        digest = hashlib.sha256(sealed.header).hexdigest()
        return next((s for s in self.sequences() if s["header_sha256"] == digest), None)

    def wait(
        self,
        sequence_id: str,
        index: int,
        *,
        timeout: float,
        poll_interval: float = 2.0,
        states: tuple[str, ...] = ("review", "running"),
    ) -> StepResult:
        """Poll a step until it leaves `states` (`review` or `running`), or until `timeout`."""
        deadline = time.monotonic() + timeout
        result = self.step(sequence_id, index)
        while result.status in states and time.monotonic() < deadline:
            time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
            result = self.step(sequence_id, index)
        return result

    def _check_whole(self, sealed: SealedSequence) -> None:
        """Verify the whole file (her signature, T_0, every trace and body) before anything is
        revealed: a step that cannot verify would otherwise leave the sequence stuck open after
        the earlier steps were released. CA endorsements and the validity period are the
        server's to check (it knows the CAs and the time); the chain is checked at creation."""
        bare = sealed.model_copy(update={"endorsements": ()})
        try:
            verify_whole(bare, self._key.public_key(), at=sealed.header_fields.created)
        except ProtocolError as exc:
            raise TamperedSequence(
                f"the sealed file does not verify ({exc}); nothing was revealed"
            ) from exc

    def run(
        self,
        sealed: SealedSequence,
        *,
        review_timeout: float = 0.0,
        poll_interval: float = 2.0,
        on_step: Callable[[StepResult], None] | None = None,
        progress: bool | Callable[[str], None] = False,
    ) -> Results:
        """Drive a sealed sequence tit-for-tat and return the result of every revealed step.

        Reveals step j+1 only after step j was released; stops after a withhold or failure; a
        step in review is polled for up to `review_timeout` seconds and returned as `review` if
        still undecided (call `run` again later to continue). A sequence already opened on the
        server is resumed, never opened twice, and its earlier steps are returned (and passed to
        `on_step`) too. The returned `Results` is a list with `.save(dir)`.

        `on_step(result)` is called with each step's result as soon as it is final (or left in
        review or pending), in order, before the next step is revealed: e.g. to save or plot as
        results arrive. `progress=True` prints a line per step as it goes ("step 2 of 5
        (regression): revealed, running…", "waiting for an output checker…"); pass a function
        taking a line to send them elsewhere.
        """
        say: Callable[[str], None] = (
            (lambda line: print(line, flush=True))
            if progress is True
            else (progress if callable(progress) else (lambda line: None))
        )
        total = sealed.steps

        def kind_of(index: int) -> str:
            try:
                return str(json.loads(sealed.bodies[index - 1]).get("kind", "analysis"))
            except (ValueError, AttributeError):
                return "analysis"

        def step_done(result: StepResult) -> None:
            say(
                f"step {result.index} of {total} ({result.kind or kind_of(result.index)}): "
                f"{result.status.upper()}"
            )
            if on_step is not None:
                on_step(result)

        fields = sealed.header_fields
        self._check_whole(sealed)
        health = self.health()
        server_id = health["server_id"]
        if fields.server != server_id:
            raise WrongServer(
                f"this sequence is bound to server {fields.server!r}, but {self.url} is "
                f"{server_id!r}; nothing was revealed"
            )
        announced = public_key_from_raw(base64.b64decode(health["server_public_key"]))
        if self.server_key is None:
            # Trust on first use within this session; pin it with connect(server_key=...).
            self.server_key = announced
        elif public_key_raw(self.server_key) != public_key_raw(announced):
            raise WrongServer(
                f"{self.url} announces a different signing key than the one pinned for it; "
                "nothing was revealed"
            )
        if self.journal is not None:
            # Kept before anything is revealed: a stop at review must not lose the later steps.
            self.journal.record(sealed, server_url=self.url, researcher=self.researcher)
        results = Results(sealed)
        existing = self.find(sealed)
        if existing is None:
            say(f"step 1 of {total} ({kind_of(1)}): opening the sequence, running…")
            try:
                current = self.open(sealed)
            except (Unreachable, ServerError) as exc:
                # The open may have been accepted before the connection broke: look for it.
                if isinstance(exc, ServerError) and exc.status not in (409, 503):
                    raise
                existing = self._retrying(lambda: self.find(sealed))
                if existing is None:
                    raise
                current = self._resume(existing, sealed, results, step_done)
        else:
            say(f"resuming sequence {existing['id']}")
            current = self._resume(existing, sealed, results, step_done)
        if self.journal is not None:
            self.journal.record(
                sealed,
                server_url=self.url,
                researcher=self.researcher,
                sequence_id=current.sequence_id,
            )
        while True:
            if current.status == "pending" and review_timeout > 0:
                # Past the withhold budget: wait for a checker to approve opening the sequence.
                say("waiting for an output checker to approve opening the sequence…")
                current = self.wait(
                    current.sequence_id,
                    current.index,
                    timeout=review_timeout,
                    poll_interval=poll_interval,
                    states=("pending",),
                )
            if current.status == "running":
                # Left unfinished by a server restart: re-sending the reveal re-runs it.
                current = self.reveal(current.sequence_id, sealed, current.index)
            if current.status == "review" and review_timeout > 0:
                say(
                    f"step {current.index} of {total}: in review, waiting for an output "
                    f"checker… (up to {review_timeout:g} s)"
                )
                current = self.wait(
                    current.sequence_id,
                    current.index,
                    timeout=review_timeout,
                    poll_interval=poll_interval,
                )
            self._check_receipt(current, sealed)
            current = self._with_file(current)
            results.append(current)
            step_done(current)
            if not current.released or current.last:
                return results
            following = current.index + 1
            say(f"step {following} of {total} ({kind_of(following)}): revealed, running…")
            current = self.reveal(current.sequence_id, sealed, following)

    def _resume(
        self,
        existing: dict[str, Any],
        sealed: SealedSequence,
        results: list[StepResult],
        on_step: Callable[[StepResult], None] | None,
    ) -> StepResult:
        """Collect the finished steps of an opened sequence; return the step to continue from."""
        steps = [StepResult.from_json(s) for s in existing["steps"]]
        if not steps:
            return self.reveal(existing["id"], sealed, 1)
        for earlier in steps[:-1]:
            self._check_receipt(earlier, sealed)
            step = self._with_file(earlier)
            results.append(step)
            if on_step is not None:
                on_step(step)
        return steps[-1]

    def _with_file(self, result: StepResult) -> StepResult:
        """A released step with its file (synthetic records) fetched and hash-checked, so the
        results folder and the card hold the records themselves."""
        if not result.released or result.output is None or "file" not in result.output:
            return result
        return dataclasses.replace(result, file_data=self.step_file(result))

    def _check_receipt(self, result: StepResult, sealed: SealedSequence) -> None:
        if result.status not in FINAL_STATES:
            return
        assert self.server_key is not None  # pinned or learnt at the start of run()
        try:
            verify_receipt(result, self.server_key, sealed)
        except ReceiptInvalid as exc:
            raise BadReceipt(str(exc)) from exc


def _metadata_of(entry: dict[str, Any]) -> DatasetMetadata:
    """The published metadata of a catalogue entry: what the plan and the rehearsal check
    against, so the storage (which kinds run out of memory) and the DP neighbouring relation
    come with the columns."""
    extra: dict[str, Any] = {"storage": entry.get("storage", "memory")}
    if entry.get("neighbours"):
        extra["neighbours"] = NeighbouringRelation.model_validate(entry["neighbours"])
    return DatasetMetadata(
        name=entry["name"],
        version=int(entry["version"]),
        description=entry.get("description", ""),
        columns=[Column.model_validate(c) for c in entry["columns"]],
        **extra,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def connect(
    url: str,
    key: Ed25519PrivateKey | Path | str | bytes,
    researcher: str,
    **options: Any,
) -> Session:
    """A session with the server at `url`, signing as `researcher` with `key` (a private key,
    or a PEM file path or bytes). Pass `server_key=` (the centre's Ed25519 public key, obtained
    out of band) to pin it; otherwise the key the server announces is trusted for the session and
    every step's receipt is checked against it. Pass `ca_bundle=` (a PEM file) to trust the CA
    that issued the centre's TLS certificate instead of the system's CAs."""
    if isinstance(key, Ed25519PrivateKey):
        private = key
    elif isinstance(key, bytes):
        private = load_private_key(key)
    else:
        private = load_private_key(Path(key).expanduser())
    return Session(url, private, researcher, **options)
