"""The certification authority end to end: sequences certified with `safeaccess.client.ca`,
opened over real HTTP against a centre that requires claims per kind, with the real sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre, open_body_with_endorsements, resigned_log, reveal_body, signed

from safeaccess.client import ca
from safeaccess.client.analyses import (
    Analysis,
    Fairness,
    FrequencyTable,
    ModelParams,
    ModelTraining,
    to_body,
)
from safeaccess.client.protocol import SealedSequence, endorse, seal
from safeaccess.client.session import ServerError, connect
from safeaccess.server.config import DataDir
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.applicants import applicants_metadata, generate_applicants
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.steps import claims as claim_gate

DATASET = "applicants"
APPLICANTS = generate_applicants()
TABLE = FrequencyTable(rows=["region"])
TREE = ModelTraining(
    family="decision_tree",
    target="approved",
    features=["age", "income", "region"],
    params=ModelParams(max_depth=3, min_samples_leaf=50),
    fairness=Fairness(protected="group", treatment="reweighing"),
    seed=11,
)


def seal_for(
    centre: Centre, analyses: list[Analysis], *, declare: bool = True, dataset: str = DATASET
) -> SealedSequence:
    return seal(
        [to_body(a) for a in analyses],
        centre.keys["ada"],
        researcher="ada",
        project="p1",
        dataset=dataset,
        server=centre.server_id,
        kinds=[a.kind for a in analyses] if declare else None,
    )


def certified(centre: Centre, sealed: SealedSequence, policy: str = "fair") -> SealedSequence:
    return ca.certify(
        sealed,
        ca.load_policy(policy),
        centre.keys["ada"].public_key(),
        centre.ca_key,
        "ethics-board",
        protected=["group"] if policy == "fair" else (),
    )


@pytest.fixture(scope="module")
def gated(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> Iterator[tuple[Service, EmbeddedServer]]:
    """The centre with the applicants dataset, whose model training requires the claim `fair`."""
    service, srv = server
    register_dataset(
        DataDir(centre.root),
        service.store,
        name=DATASET,
        frame=APPLICANTS,
        metadata=applicants_metadata(DATASET),
        project="p1",
    )
    assert claim_gate.require_claim(service.store, DATASET, "model_training", "fair")
    yield service, srv
    claim_gate.drop_claim(service.store, DATASET, "model_training", "fair")


def sequence_count(service: Service) -> int:
    return len(service.store.list_sequences("ada"))


def open_raw(srv: EmbeddedServer, centre: Centre, sealed: SealedSequence) -> tuple[int, dict]:
    response = signed(
        srv.url,
        centre.keys["ada"],
        "ada",
        "POST",
        "/v1/sequences",
        open_body_with_endorsements(sealed),
    )
    return response.status_code, response.json()


def test_uncertified_model_sequence_is_refused_at_open_naming_the_claim(
    centre: Centre, gated: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = gated
    before = sequence_count(service)
    sealed = seal_for(centre, [TABLE, TREE])
    status, body = open_raw(srv, centre, sealed)
    assert status == 403
    assert body["error"]["code"] == "endorsement_required"
    assert "'fair'" in body["error"]["message"]
    assert "'model_training'" in body["error"]["message"]
    assert sequence_count(service) == before  # nothing half-opened

    # The same header, once certified, opens: the refusal consumed nothing.
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        first = session.open(certified(centre, sealed))
    assert first.released
    opened = [e for e in service.store.events(first.sequence_id) if e.kind == "sequence_opened"]
    record = opened[0].data
    assert record["claims"][0]["ca"] == "ethics-board"
    assert record["claims"][0]["claims"]["policy"] == "fair"
    assert record["declared_kinds"] == ["frequency_table", "model_training"]
    assert record["required_claims"] == {"model_training": ["fair"]}


def test_an_endorsement_under_another_policy_does_not_satisfy_the_claim(
    centre: Centre, gated: tuple[Service, EmbeddedServer]
) -> None:
    _, srv = gated
    sealed = certified(centre, seal_for(centre, [TABLE, TREE]), "explainable")
    status, body = open_raw(srv, centre, sealed)
    assert (status, body["error"]["code"]) == (403, "endorsement_required")


def test_undeclared_sequence_is_stopped_at_the_model_step_and_stays_put(
    centre: Centre, gated: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = gated
    sealed = seal_for(centre, [TABLE, TREE], declare=False)
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        first = session.open(sealed)
        assert first.released
        with pytest.raises(ServerError) as refused:
            session.reveal(first.sequence_id, sealed, 2)
    assert refused.value.code == "endorsement_required"
    assert "step 2" in str(refused.value) and "'fair'" in str(refused.value)
    seq = service.store.get_sequence(first.sequence_id)
    assert seq is not None and (seq.current_index, seq.state) == (1, "released")
    assert len(service.store.steps(first.sequence_id)) == 1


def test_a_step_of_an_undeclared_kind_is_refused(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    analyses: list[Analysis] = [TABLE, FrequencyTable(rows=["employment"])]
    bodies = [to_body(a) for a in analyses]
    # Declares only model_training-free tables but the researcher lies about nothing here:
    # declare "summary" for a sequence of tables, so step 1 is already undeclared.
    sealed = seal(
        bodies,
        centre.keys["ada"],
        researcher="ada",
        project="p1",
        dataset="census",
        server=centre.server_id,
        kinds=["frequency_table"],
    )
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        assert session.open(sealed).released
    lying = seal(
        bodies,
        centre.keys["ada"],
        researcher="ada",
        project="p1",
        dataset="census",
        server=centre.server_id,
        kinds=["summary"],
    )
    before = sequence_count(service)
    status, body = open_raw(srv, centre, lying)
    assert (status, body["error"]["code"]) == (403, "kind_not_declared")
    assert sequence_count(service) == before


def test_endorsement_by_untrusted_ca_or_for_another_header_is_refused(
    centre: Centre, gated: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = gated
    before = sequence_count(service)
    sealed = seal_for(centre, [TABLE, TREE])
    rogue_key = Ed25519PrivateKey.generate()
    rogue = ca.certify(
        sealed,
        ca.load_policy("fair"),
        centre.keys["ada"].public_key(),
        rogue_key,
        "rogue",
        protected=["group"],
    )
    status, body = open_raw(srv, centre, rogue)
    assert (status, body["error"]["code"]) == (422, "untrusted_ca")
    assert "'rogue'" in body["error"]["message"]

    # A genuine endorsement of another sequence, moved onto this one.
    other = certified(centre, seal_for(centre, [TABLE, TREE]))
    moved = sealed.with_endorsement(other.endorsements[0])
    status, body = open_raw(srv, centre, moved)
    assert (status, body["error"]["code"]) == (422, "endorsement")
    assert "another header" in body["error"]["message"]

    # A trusted CA's name with another key (a forged endorsement).
    forged = sealed.with_endorsement(
        endorse(sealed, rogue_key, ca="ethics-board", claims={"policy": "fair"})
    )
    status, body = open_raw(srv, centre, forged)
    assert (status, body["error"]["code"]) == (422, "endorsement")
    assert sequence_count(service) == before


def test_reveal_after_refusal_of_a_tampered_step_is_still_refused(
    centre: Centre, gated: tuple[Service, EmbeddedServer]
) -> None:
    """A certified sequence whose step-2 body is swapped for an uncertified model: the chain
    refuses it (the endorsement covers exactly the certified bodies)."""
    _, srv = gated
    sealed = certified(centre, seal_for(centre, [TABLE, TREE]))
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        first = session.open(sealed)
    assert first.released
    deep = TREE.model_copy(update={"params": ModelParams(max_depth=20)})
    swapped = sealed.model_copy(update={"bodies": (sealed.bodies[0], to_body(deep))})
    response = signed(
        srv.url,
        centre.keys["ada"],
        "ada",
        "POST",
        f"/v1/sequences/{first.sequence_id}/steps/2",
        reveal_body(swapped, 2),
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "body_digest"


def test_certified_fair_tree_runs_is_released_and_reproduces_its_test_metrics(
    centre: Centre, gated: tuple[Service, EmbeddedServer]
) -> None:
    """The issue's end-to-end path: seal (declaring kinds), certify `fair`, run through the
    real server, get the model with its fairness report, load it into a predictor."""
    _, srv = gated
    endorsed = certified(centre, seal_for(centre, [TABLE, TREE]))
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        results = session.run(endorsed)
    assert [r.released for r in results] == [True, True], results[-1].describe()
    output = results[1].output
    assert output is not None and output["type"] == "model"
    report = output["fairness"]
    assert report["protected"] == "group" and report["treatment"] == "reweighing"
    assert report["demographic_parity_difference"] is not None
    predictor = results[1].model()

    # Redo the documented split on the confidential data the test holds, and predict the
    # test records with the released model alone.
    from sklearn.model_selection import train_test_split

    data = APPLICANTS
    columns = [*TREE.features, TREE.target, "group"]
    complete = data.dropna(subset=columns).reset_index(drop=True)
    levels = ["no", "yes"]
    y = complete[TREE.target].astype(str).map(levels.index).to_numpy()
    _, test = train_test_split(
        np.arange(len(y)), test_size=TREE.test_fraction, random_state=TREE.seed, stratify=y
    )
    records = complete.iloc[np.sort(test)][TREE.features].to_dict("records")
    predicted = predictor.predict(records)
    truth = complete.iloc[np.sort(test)][TREE.target].astype(str).tolist()
    accuracy = float(np.mean([p == t for p, t in zip(predicted, truth, strict=True)]))
    assert output["n_test"] == len(test)
    assert accuracy == pytest.approx(output["metrics"]["accuracy"], abs=1e-12)


def test_the_gated_log_with_required_claims_verifies(
    centre: Centre, gated: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    """The verifier replays the dataset's required claims: the honest log of this module (a
    certified model sequence, refused uncertified ones) verifies, its claims checked.

    Issue 41, point 4: the sequence pins the dataset's version (`applicants@1`, as every plan
    made by `session.plan` does), and the claims are required of the name: a log whose opening
    lost its endorsement, re-signed by the centre, must fail."""
    from safeaccess.client.audit.verify import AuditFailure, ExportSource, verify_log

    service, srv = gated
    endorsed = certified(centre, seal_for(centre, [TABLE, TREE], dataset=f"{DATASET}@1"))
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        results = session.run(endorsed)
    assert [r.released for r in results] == [True, True]
    export = tmp_path / "gated.export"
    export.write_bytes(b"".join(service.audit.export()))
    report = verify_log(ExportSource(export))
    assert report.kinds.get("claim_required", 0) >= 1 and report.sequences >= 1

    def unendorsed(parsed: list[dict[str, Any]]) -> None:
        opened = next(
            p
            for p in parsed
            if p["kind"] == "sequence_opened" and p["sequence"] == results[0].sequence_id
        )
        opened["data"]["endorsements"] = []
        opened["data"]["claims"] = []

    with pytest.raises(AuditFailure) as info:
        verify_log(resigned_log(service, tmp_path / "unendorsed.export", unendorsed))
    assert "requires the claim(s) fair that no endorsement of the sequence grants" in str(
        info.value
    )
