"""`safeaccess-server demo`: the whole tit-for-tat loop on an embedded server, over real HTTP.

A fresh data directory gets the generated census, a demo project and researcher. The researcher
seals a sequence in which the early analyses are safe and one (ethnicity by region) has cells
below the threshold. The client session reveals step by step: the unsafe step is withheld, the
sequence aborts, and the analyses after it are never revealed to the centre.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import (
    DP_KINDS,
    Analysis,
    FrequencyTable,
    MagnitudeTable,
    Regression,
    Summary,
)
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.plan import Plan
from safeaccess.client.results import StepResult, format_output
from safeaccess.client.session import connect
from safeaccess.sandbox.backend import SandboxError
from safeaccess.sandbox.config import resolve_backend_name
from safeaccess.server.config import DataDir, DPConfig, initialise, set_sandbox_image
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.errors import ConfigError
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

PROJECT = "health-inequalities"
RESEARCHER = "ada"
DATASET = "census"
DP_DATASET = "census-dp"
#: The DP dataset's budget: every researcher may spend epsilon 2 at delta 1e-6 on it.
DP_CONFIG = DPConfig(epsilon=2.0, delta=1e-6, scope="researcher", mandatory=True)


def demo_plan(metadata: DatasetMetadata) -> Plan:
    """The demo sequence: safe, safe, safe, unsafe (withheld), then one never revealed."""
    return (
        Plan(metadata.label, metadata)
        .frequency_table("region", "sex")
        .ols("income ~ age + C(sex)", where="employment == 'employed'")
        .magnitude_table("income", "region", agg="mean", where="age >= 30")
        .frequency_table("ethnicity", "region")
        .frequency_table("health", "ethnicity")
    )


def dp_plan(metadata: DatasetMetadata) -> Plan:
    """The DP sequence: noisy counts, a mean vector asked in its optimally transformed form, a
    histogram (epsilons adding up to 2.5, yet within the budget of 2: Gaussian composition is
    exact, not additive), and a query that no longer fits (withheld, saying what is left)."""
    return (
        Plan(DP_DATASET, metadata)
        .dp_count(by="region", epsilon=0.5, delta=1e-7)
        .dp_mean(["age", "income"], by="sex", epsilon=1.0, delta=1e-7, region=True)
        .dp_histogram("age", [16, 25, 35, 45, 55, 65, 75, 95], epsilon=1.0, delta=1e-7)
        .dp_count(by="employment", epsilon=1.5, delta=1e-7)
    )


def describe(analysis: Analysis) -> str:
    """One line saying what an analysis asks, for the demo's account."""
    data = analysis.model_dump(exclude_defaults=True)
    kind = data.pop("kind", analysis.kind)
    if isinstance(analysis, FrequencyTable):
        text = "frequency table of " + " x ".join(analysis.rows)
        if analysis.cols:
            text += " by " + " x ".join(analysis.cols)
    elif isinstance(analysis, Summary):
        text = f"{', '.join(analysis.statistics)} of {', '.join(analysis.variables)}"
        if analysis.by:
            text += " by " + ", ".join(analysis.by)
    elif isinstance(analysis, MagnitudeTable):
        text = f"{analysis.agg} of {analysis.value} by " + " x ".join(analysis.rows + analysis.cols)
    elif isinstance(analysis, Regression):
        text = f"{analysis.family.upper()} regression {analysis.formula}"
    elif analysis.kind in DP_KINDS:
        budget = (
            f"sigma={data['sigma']:g}"
            if "sigma" in data
            else f"epsilon={data['epsilon']:g}, delta={data['delta']:g}"
        )
        what = data.get("variables") or data.get("variable") or "records"
        text = f"{kind} of {what} ({budget})"
        if data.get("by"):
            text += " by " + ", ".join(data["by"])
        if data.get("transform"):
            text += f", transformed for a confidence {data['transform']['goal']}"
    else:
        text = f"{kind} {data}"
    if analysis.where:
        text += f" where {analysis.where}"
    return text


def prepare(root: Path, *, rows: int, researcher_key: Ed25519PrivateKey) -> None:
    """Initialise a data directory with the census, a project and the demo researcher."""
    initialise(root, server_id="demo-centre")
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        store.add_project(PROJECT)
        public = researcher_key.public_key()
        store.add_researcher(RESEARCHER, public_key_text(public), fingerprint(public), [PROJECT])
        census = generate_census(rows)
        for name in (DATASET, DP_DATASET):
            register_dataset(
                data,
                store,
                name=name,
                frame=census,
                metadata=census_metadata(name),
                project=PROJECT,
            )
        # The same people, answered only with calibrated noise and a budget.
        store.set_dp_config(DP_DATASET, DP_CONFIG.model_dump(mode="json"))
    finally:
        store.close()


def _docker_image_for_demo(root: Path, out: Callable[[str], None]) -> None:
    """With SAFEACCESS_SANDBOX_BACKEND=docker, build (or reuse) the sandbox image from the local
    installation and record its id, so that switching the demo to Docker takes one line."""
    data = DataDir(root)
    config = data.load_config()
    try:
        if resolve_backend_name(config.sandbox) != "docker" or config.sandbox.docker.image:
            return
        from safeaccess.sandbox.docker import build_image, connect, engine_address

        client = connect(engine_address(config.sandbox.docker))
        client.ping()
        built = build_image(client)
    except SandboxError as exc:
        raise ConfigError(str(exc)) from exc
    except Exception as exc:  # the Docker SDK raises its own and requests' errors
        raise ConfigError(f"the Docker sandbox is unusable: {exc}") from exc
    out(f"Sandbox image {built.image_id[:19]} ({'reused' if built.reused else 'built'})")
    set_sandbox_image(data.config_path, built.image_id)


def summarise(results: list[StepResult], planned: int, out: Callable[[str], None]) -> None:
    """How a sequence ended, and what the centre never saw of it."""
    last = results[-1]
    unrevealed = planned - last.index
    out(f"Sequence {last.sequence_id}: {last.sequence_state}.")
    if unrevealed:
        out(
            f"{unrevealed} analysis(es) after step {last.index} were never revealed: the centre "
            "holds only their place in the hash chain,\nso a researcher cannot learn from a "
            "withheld step and then pick a different next question."
        )


def run_demo(
    data_dir: Path | None, *, rows: int = 20_000, out: Callable[[str], None] = print
) -> int:
    """Run the demo; returns 0 when it went as designed (releases, then one withhold)."""
    if data_dir is None:
        with tempfile.TemporaryDirectory(prefix="safeaccess-demo-") as tmp:
            return _run(Path(tmp) / "data", rows, out)
    return _run(data_dir, rows, out)


def _run(root: Path, rows: int, out: Callable[[str], None]) -> int:
    key = Ed25519PrivateKey.generate()
    out(f"Preparing a safe access centre in {root} with {rows} generated census records ...")
    prepare(root, rows=rows, researcher_key=key)
    try:
        _docker_image_for_demo(root, out)
        service = Service(root)
    except ConfigError as exc:
        out(f"cannot start the demo: {exc}")
        return 1
    with service, EmbeddedServer(create_app(service)) as server:
        out(
            f"Server {service.server_id} listening on {server.url} (sandbox: {service.backend.name})"
        )
        with connect(server.url, key, RESEARCHER) as session:
            # The researcher plans against the catalogue's metadata (she never sees the data),
            # pinned to the version it describes; the session seals for her, the dataset's
            # project and this centre.
            plan = demo_plan(session.metadata(DATASET))
            sealed = session.seal(plan)
        analyses = list(plan.analyses)
        out(
            f"\n{RESEARCHER} seals {len(analyses)} analyses into one binding sequence and signs "
            "its header;\nthe server sees each analysis only when she reveals it, after the "
            "previous output was released.\n"
        )

        def shower(items: list[Analysis]) -> Callable[[StepResult], None]:
            return lambda result: show(result, items)

        def show(result: StepResult, items: list[Analysis]) -> None:
            out(f"--- step {result.index}: {describe(items[result.index - 1])}")
            out(f"    decision: {result.status.upper()}")
            for reason in result.reasons:
                out(f"      because {reason}")
            if result.withheld and result.withhold_budget is not None:
                out(f"      {result.withhold_budget}")
            if result.failed:
                out(f"      {result.error_code}: {result.error_message}")
            if result.receipt is not None:
                # run() has already checked it against the sealed sequence and the output.
                out("    receipt: signed by the centre, verified against the sealed sequence")
            dp = result.dp
            if dp is not None:
                out("\n".join("    " + line for line in dp.describe().splitlines()))
            if result.released:
                out("    released output:")
                out("\n".join("      " + line for line in format_output(result).splitlines()))
            out("")

        with connect(server.url, key, RESEARCHER) as session:
            results = session.run(sealed, on_step=shower(analyses))
            dp_entry = next(d for d in session.datasets() if d["name"] == DP_DATASET)
        summarise(results, len(analyses), out)
        dp_meta = DatasetMetadata(
            name=DP_DATASET, description=dp_entry["description"], columns=dp_entry["columns"]
        )
        dp_analyses = list(dp_plan(dp_meta).analyses)
        dp_sealed = dp_plan(dp_meta).seal(
            key, researcher=RESEARCHER, project=PROJECT, server=service.server_id
        )
        out(
            f"\nDataset {DP_DATASET} holds the same people but answers only with differential "
            f"privacy:\na budget of epsilon={DP_CONFIG.epsilon:g} at delta={DP_CONFIG.delta:g} per "
            "researcher; the server adds Gaussian noise after the sandbox computed the exact "
            "statistic.\n"
        )
        with connect(server.url, key, RESEARCHER) as session:
            dp_results = session.run(dp_sealed, on_step=shower(dp_analyses))
        summarise(dp_results, len(dp_analyses), out)
        audited = _audit(service, server.url, out)
    last = results[-1]
    released = sum(r.released for r in results)
    dp_released = sum(r.released for r in dp_results)
    ok = audited and released >= 1 and (last.withheld or last.last) and dp_released >= 2
    return 0 if ok else 1


def _audit(service: Service, url: str, out: Callable[[str], None]) -> bool:
    """An auditor verifies the whole log over HTTP, as `safeaccess audit verify` does."""
    from safeaccess.client.audit.remote import ServerSource, SignedClient
    from safeaccess.client.audit.verify import AuditFailure, verify_log
    from safeaccess.client.keys import fingerprint, public_key_text

    auditor = Ed25519PrivateKey.generate()
    service.store.add_auditor(
        "demo-auditor", public_key_text(auditor.public_key()), fingerprint(auditor.public_key())
    )
    out("An auditor verifies the centre's audit log (safeaccess audit verify):")
    client = SignedClient(url, auditor, "demo-auditor")
    try:
        report = verify_log(ServerSource(client, service.signing_key.public_key()))
    except AuditFailure as exc:
        out(f"    FAILED: {exc}")
        return False
    finally:
        client.close()
    for line in report.lines():
        out("    " + line)
    out("")
    return True
