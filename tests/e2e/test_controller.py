"""The controller's side through the real server and client: the rule set's thresholds in the
catalogue, and `dataset rules NAME FILE` changing them on a running server without registering
the data again (the next step is decided by the new rules; earlier decisions keep theirs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Centre

from safeaccess.client.session import connect
from safeaccess.server.admin.cli import main as admin
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def test_dataset_rules_change_thresholds_on_a_running_server(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, srv = server
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        rules = session.catalogue_entry("census")["rules"]
        assert rules["threshold"] == 10 and rules["dof"] == 10 and rules["name"] == "default"
        assert len(rules["sha256"]) == 64
        plan = session.plan("census").frequency_table("sex")
        before = session.run(session.seal(plan))
        assert before[0].released and before[0].ruleset == "default@1"

        strict = tmp_path / "strict.yaml"
        strict.write_text('name: strict\nversion: "2"\nthreshold: 100000\n')
        capsys.readouterr()
        args = ["dataset", "rules", "census", str(strict), "--data-dir", str(centre.root)]
        assert admin(args) == 0
        assert "census@1: rule set strict@2" in capsys.readouterr().out

        rules = session.catalogue_entry("census")["rules"]
        assert rules["threshold"] == 100000 and rules["name"] == "strict"
        after = session.run(session.seal(session.plan("census").frequency_table("sex")))
        assert after[0].withheld and after[0].ruleset == "strict@2"
        # The earlier decision still names the rules it was made with.
        assert session.step(before[0].sequence_id, 1).ruleset == "default@1"

        broken = tmp_path / "broken.yaml"
        broken.write_text("threshold: -3\n")
        assert admin([*args[:3], str(broken), *args[4:]]) == 2
        assert "rule set" in capsys.readouterr().err
        assert session.catalogue_entry("census")["rules"]["name"] == "strict"
