"""The `synthetic_data` kind through the real server, client and process sandbox.

Expected figures come from outside the code under test: mu = 0.18197 at (1, 1e-9) (the design
note's GDP figure), the charge recomputed here from the released sigmas with the marginal
sensitivity sqrt(K) worked out by hand, and the synthetic file's hash recomputed from its bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Dataset, HtmlCards, centre_store, make_centre, serving, set_dp

from safeaccess.client.analyses import Analysis, SyntheticData, to_body
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import SealedSequence, seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import ServerError, connect
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store.schema import StepRow
from safeaccess.server.synth.protocol import WorkerRequest
from safeaccess.server.synth.step import FILES_DIR as SYNTH_DIR
from safeaccess.server.synth.worker_client import SynthWorkerFailed, WorkerResult

pytest.importorskip("mbi")

MU_1_1E9 = 0.18197  # GDP mu at (epsilon, delta) = (1, 1e-9), design note section 3.3
CMC_FILE = Path(__file__).resolve().parents[1] / "vectors" / "cmc" / "contraceptive.csv"
CMC_COLUMNS = [
    "wife_age",
    "wife_education",
    "husband_education",
    "children",
    "wife_religion",
    "wife_working",
    "husband_occupation",
    "standard_of_living",
    "media_exposure",
    "contraceptive_method",
]
# the design note's scenario 2: these keys known, the husband's education inferred
CMC_KEYS = ["wife_age", "wife_education", "children", "wife_religion", "wife_working"]
CMC_TARGET = "husband_education"


def cmc_frame() -> pd.DataFrame:
    return pd.read_csv(CMC_FILE, comment="#", header=None, names=CMC_COLUMNS)


def cmc_metadata(name: str) -> DatasetMetadata:
    def levels(col: str, values: list[int]) -> Column:
        return Column(
            name=col,
            type="categorical" if len(values) > 2 and col == "contraceptive_method" else "ordinal",
            levels=values,
            nullable=False,
            quasi_identifier=col in CMC_KEYS,
            sensitive=col == CMC_TARGET,
        )

    four = [1, 2, 3, 4]
    return DatasetMetadata(
        name=name,
        columns=[
            Column(
                name="wife_age",
                type="integer",
                bounds=(16, 49),
                nullable=False,
                quasi_identifier=True,
                synth_bins=[16.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 49.0],
            ),
            levels("wife_education", four),
            levels("husband_education", four),
            Column(
                name="children",
                type="integer",
                bounds=(0, 16),
                nullable=False,
                quasi_identifier=True,
                synth_bins=[float(c) for c in range(0, 17)],
            ),
            levels("wife_religion", [0, 1]),
            levels("wife_working", [0, 1]),
            levels("husband_occupation", four),
            levels("standard_of_living", four),
            levels("media_exposure", [0, 1]),
            levels("contraceptive_method", [1, 2, 3]),
        ],
    )


#: The synthetic data checks' gates, all opened by a rule set (as a controller may).
OPEN_GATES = (
    "synth_attack_excess_review",
    "synth_attack_excess_withhold",
    "synth_certain_correct_withhold",
    "synth_full_row_uniques_review",
    "synth_full_row_uniques_withhold",
    "synth_dcr_close_review",
    "synth_dcr_close_withhold",
    "synth_yp_p",
)


@dataclass
class SynthCentre:
    root: Path
    server_id: str
    keys: dict[str, Ed25519PrivateKey]
    census: pd.DataFrame

    def seal(self, analyses: list[Analysis], *, dataset: str, who: str = "ada") -> SealedSequence:
        return seal(
            [to_body(a) for a in analyses],
            self.keys[who],
            researcher=who,
            project="p1",
            dataset=dataset,
            server=self.server_id,
        )


@pytest.fixture(scope="module")
def centre(tmp_path_factory: pytest.TempPathFactory) -> SynthCentre:
    root = tmp_path_factory.mktemp("synthcentre") / "data"
    keys = {name: Ed25519PrivateKey.generate() for name in ("ada", "bob")}
    census = generate_census(1000, seed=23)
    open_rules = root.parent / "cmcopen-rules.yaml"
    # the synth_* gates opened (a controller may; the default rules stay in force on "cmc"):
    # the file path is exercised whatever the check would say
    open_rules.write_text("name: cmc-open\n" + "".join(f"{key}: 1.0\n" for key in OPEN_GATES))
    datasets = {
        "cmc": (cmc_frame(), cmc_metadata("cmc")),
        "cmccrash": (cmc_frame(), cmc_metadata("cmccrash")),
        "cmcopen": Dataset(
            cmc_frame(), cmc_metadata("cmcopen"), options={"rules_file": open_rules}
        ),
        "plain": (census, census_metadata("plain")),
    }
    config = make_centre(root, "synth-centre", keys, datasets)
    for name in ("cmc", "cmccrash", "cmcopen"):
        set_dp(root, name, "50", "1e-5")
    return SynthCentre(root=root, server_id=config.server_id, keys=keys, census=census)


@pytest.fixture(scope="module")
def server(centre: SynthCentre) -> Iterator[tuple[Service, EmbeddedServer]]:
    with serving(centre.root) as (service, srv):
        yield service, srv


def _run(
    server: tuple[Service, EmbeddedServer], centre: SynthCentre, sealed: SealedSequence
) -> list[StepResult]:
    with connect(server[1].url, centre.keys["ada"], "ada") as session:
        return session.run(sealed)


def _ledger(centre: SynthCentre, dataset: str, who: str = "ada") -> tuple[float, int]:
    with centre_store(centre.root) as store:
        state = store.dp_ledger(f"{dataset}|researcher|{who}")
        return state.spent, state.releases


def _charge_by_hand(privacy: dict[str, object], d: int) -> float:
    """sum (sqrt(K_i) / sigma_i)^2, m = 1: d one-way tables (one cell per record each), the
    P = d(d-1)/2 pair scores as one vector, the d-1 tree tables."""
    p = d * (d - 1) // 2
    return (
        d / float(privacy["sigma_oneway"]) ** 2  # type: ignore[arg-type]
        + p / float(privacy["sigma_selection"]) ** 2  # type: ignore[arg-type]
        + (d - 1) / float(privacy["sigma_cliques"]) ** 2  # type: ignore[arg-type]
    )


def _step_row(server: tuple[Service, EmbeddedServer], result: StepResult) -> StepRow:
    row = server[0].store.get_step(result.sequence_id, result.index)
    assert row is not None
    return row


def test_mst_charges_the_ledger_exactly_mu_squared_and_shows_only_the_verdict(
    server: tuple[Service, EmbeddedServer], centre: SynthCentre
) -> None:
    before = _ledger(centre, "cmc")
    analysis = SyntheticData(columns=CMC_COLUMNS, epsilon=1.0, delta=1e-9)
    (result,) = _run(server, centre, centre.seal([analysis], dataset="cmc"))
    row = _step_row(server, result)
    assert row.output is not None  # stored for checkers whatever the verdict
    privacy = row.output["privacy"]
    assert privacy["mu"] == pytest.approx(MU_1_1E9, abs=5e-5)
    after = _ledger(centre, "cmc")
    # charged whatever the verdict (the noise was drawn), once, exactly
    assert after[1] == before[1] + 1
    assert after[0] - before[0] == pytest.approx(_charge_by_hand(privacy, 10), rel=1e-9)
    assert after[0] - before[0] == pytest.approx(MU_1_1E9**2, rel=1e-3)
    assert len(privacy["tree"]) == 9
    # the check's real-data numbers are stored for checkers ...
    check = row.output["facts"]["check"]
    assert check["checks"]["n_real"] == 1473 and check["verdict"] in (
        "release",
        "review",
        "withhold",
    )
    assert (
        result.status
        == {"release": "released", "review": "review", "withhold": "withheld"}[check["verdict"]]
    )
    # ... and never reach the researcher: a released output has no facts, a withheld one is
    # the uniform reason
    if result.status == "released":
        assert result.output is not None and "facts" not in result.output
    else:
        assert result.output is None
        assert [r.check for r in result.reasons] in (["disclosure_control"], ["output_review"])


def test_released_file_is_downloaded_hash_checked_and_decoded(
    server: tuple[Service, EmbeddedServer],
    centre: SynthCentre,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    analysis = SyntheticData(columns=CMC_COLUMNS, epsilon=5.0, delta=1e-9, rows=800)
    sealed = centre.seal([analysis], dataset="cmcopen")
    with connect(server[1].url, centre.keys["ada"], "ada") as session:
        results = session.run(sealed)  # verifies the signed receipt over the output
        (result,) = results
        assert result.status == "released", _step_row(server, result).decision
        synthetic = session.synthetic(result)
    # run() fetched the records with the step: the results folder holds them, hash in summary.
    assert result.file_data == synthetic.data
    folder = results.save(tmp_path / "results")
    summary = json.loads((folder / "summary.json").read_text())
    step = summary["steps"][0]
    assert step["file"] == "steps/01-synthetic_data.parquet"
    assert (folder / step["file"]).read_bytes() == synthetic.data
    assert step["file_sha256"] == hashlib.sha256(synthetic.data).hexdigest()
    assert step["file_sha256"] == (result.output or {})["file"]["sha256"]
    pd.testing.assert_frame_equal(result.frame(), pd.read_parquet(folder / step["file"]))
    # The card: privacy figures and a preview of the records, not the output as JSON.
    card = HtmlCards(result._repr_html_())
    assert "μ = " in card.words and "first 10 of 800 synthetic records" in card.words
    assert '"measurements"' not in result._repr_html_()
    # Without pyarrow, one line naming what to install.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"needs pandas and pyarrow .*client\[synthetic\]"):
        synthetic.frame()
    monkeypatch.undo()
    out = result.output
    assert out is not None
    assert hashlib.sha256(synthetic.data).hexdigest() == out["file"]["sha256"]
    frame = synthetic.frame()
    assert list(frame.columns) == CMC_COLUMNS and len(frame) == 800 == out["file"]["rows"]
    assert frame.isna().sum().sum() == 0  # no column is nullable
    assert frame["wife_age"].between(16, 49).all() and frame["children"].between(0, 16).all()
    assert set(frame["husband_education"]) <= {1, 2, 3, 4}
    assert set(frame["contraceptive_method"]) <= {1, 2, 3}
    # every released marginal: 10 one-ways and the 9 tree tables, cells by hand
    cells = {"wife_age": 7, "children": 16, "wife_religion": 2, "wife_working": 2}
    cells["media_exposure"] = 2
    cells["contraceptive_method"] = 3
    assert len(synthetic.measurements) == 19
    for m in synthetic.measurements:
        assert len(m["values"]) == math.prod(cells.get(c, 4) for c in m["clique"])
    assert [m["clique"] for m in synthetic.measurements[10:]] == [list(e) for e in synthetic.tree]
    # utility compares to the noisy marginals only: one row per measurement
    assert len(synthetic.utility) == 19 and all(0 <= u["tvd"] <= 1 for u in synthetic.utility)
    assert out["checks"]["result"] == "passed"


def test_a_tampered_file_is_refused_by_the_client(
    server: tuple[Service, EmbeddedServer], centre: SynthCentre
) -> None:
    analysis = SyntheticData(
        columns=["wife_age", "children", "husband_education"], epsilon=5.0, delta=1e-9
    )
    with connect(server[1].url, centre.keys["ada"], "ada") as session:
        (result,) = session.run(centre.seal([analysis], dataset="cmcopen"))
        assert result.status == "released" and result.output is not None
        path = centre.root / SYNTH_DIR / f"{result.output['file']['sha256']}.parquet"
        path.write_bytes(path.read_bytes() + b"x")
        with pytest.raises(ServerError):
            session.synthetic(result)  # the server re-checks the hash before serving


def test_a_crash_mid_step_charges_the_ledger_once(
    server: tuple[Service, EmbeddedServer], centre: SynthCentre, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safeaccess.server.synth import step as synth_step

    real_worker = synth_step.run_worker
    calls: list[tuple[float, int]] = []

    def crashing(request: WorkerRequest, *, timeout: float = 600.0) -> WorkerResult:
        calls.append(_ledger(centre, "cmccrash"))  # the ledger as each attempt finds it
        if len(calls) == 1:
            raise SynthWorkerFailed("killed by the test after the noise was drawn")
        return real_worker(request, timeout=timeout)

    monkeypatch.setattr(synth_step, "run_worker", crashing)
    before = _ledger(centre, "cmccrash")
    analysis = SyntheticData(
        columns=["wife_age", "wife_education", "husband_education"], epsilon=1.0, delta=1e-9
    )
    # the crash answers 503; the client reveals the same step again, which draws fresh noise
    (result,) = _run(server, centre, centre.seal([analysis], dataset="cmccrash"))
    assert len(calls) == 2
    assert calls[1] == before  # the crashed attempt charged nothing
    row = _step_row(server, result)
    assert row.output is not None
    after = _ledger(centre, "cmccrash")
    assert after[1] == before[1] + 1
    assert after[0] - before[0] == pytest.approx(
        _charge_by_hand(row.output["privacy"], 3), rel=1e-9
    )


def test_refusals_that_depend_only_on_the_analysis_are_named(
    server: tuple[Service, EmbeddedServer], centre: SynthCentre
) -> None:
    before = _ledger(centre, "cmc")
    cases: list[tuple[str, Analysis, str, str]] = [
        (
            "plain",
            SyntheticData(columns=["region", "sex"], epsilon=1.0, delta=1e-9),
            "dp_not_enabled",
            "does not answer differentially private",
        ),
        (
            "cmc",
            SyntheticData(
                columns=["wife_age", "husband_education"],
                epsilon=1.0,
                delta=1e-9,
                bins={"wife_age": [10.0, 30.0, 49.0]},
            ),
            "invalid_analysis",
            "must lie inside its bounds",
        ),
        (
            "cmc",
            SyntheticData(columns=["wife_age", "husband_education"], epsilon=90.0, delta=1e-9),
            "",
            "",
        ),
    ]
    for dataset, analysis, code, words in cases[:2]:
        (result,) = _run(server, centre, centre.seal([analysis], dataset=dataset))
        assert result.status == "failed" and result.error_code == code, result
        assert words in (result.error_message or "")
    # over budget: withheld before the sandbox runs, with its true (public) reason
    (result,) = _run(server, centre, centre.seal([cases[2][1]], dataset="cmc"))
    assert result.status == "withheld"
    assert [r.check for r in result.reasons] == ["dp_budget"]
    assert "mu^2" in result.reasons[0].message
    assert _ledger(centre, "cmc") == before


def test_a_sandbox_outage_in_the_check_leaves_no_file_and_no_charge(
    server: tuple[Service, EmbeddedServer], centre: SynthCentre, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safeaccess.server.errors import Unavailable
    from safeaccess.server.synth import step as synth_step

    real_check = synth_step._check
    seen: list[set[str]] = []

    def flaky(job: Any, backend: Any, ruleset: Any) -> Any:
        seen.append({p.name for p in (centre.root / SYNTH_DIR).glob("*.parquet")})
        if len(seen) == 1:
            raise Unavailable("the sandbox is down (test)", code="sandbox_unavailable")
        return real_check(job, backend, ruleset)

    monkeypatch.setattr(synth_step, "_check", flaky)
    before = _ledger(centre, "cmccrash")
    files_before = {p.name for p in (centre.root / SYNTH_DIR).glob("*.parquet")}
    analysis = SyntheticData(columns=["wife_age", "children"], epsilon=1.0, delta=1e-9)
    (result,) = _run(server, centre, centre.seal([analysis], dataset="cmccrash"))
    assert len(seen) == 2
    # the first attempt's file was there during its check, and gone before the second attempt
    assert len(seen[0] - files_before) == 1 and not (seen[0] - files_before) & seen[1]
    after = _ledger(centre, "cmccrash")
    assert after[1] == before[1] + 1
    row = _step_row(server, result)
    assert row.output is not None
    assert after[0] - before[0] == pytest.approx(
        _charge_by_hand(row.output["privacy"], 2), rel=1e-9
    )
