"""The researcher guide's common path runs as written, against a real centre: connect, plan five
analyses, rehearse, seal, run and save, in at most 12 lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from e2e_helpers import Centre

from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "researcher.md"


def _block(marker: str) -> str:
    text = GUIDE.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert match is not None, f"the guide's {marker} block is missing"
    return match.group(1)


def test_the_guides_common_path_runs_and_saves(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = _block("quickstart")
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 12, lines
    _, srv = server
    key = tmp_path / "ada.key"
    key.write_bytes(
        centre.keys["ada"].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    code = code.replace('"https://sac.example.org"', repr(srv.url))
    code = code.replace('"~/.safeaccess/keys/ada.key"', repr(str(key)))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    printed = capsys.readouterr().out
    assert "rehearsal of 5 analyses on a mock of census@1" in printed
    assert "step 5 of 5 (test): RELEASED" in printed
    summary = json.loads((tmp_path / "census-results" / "summary.json").read_text())
    assert summary["outcome"] == "finished: all 5 steps released"
    assert (tmp_path / "census-results" / "README.md").exists()

    # The Plots section's example continues from there.
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    exec(compile(_block("plot"), str(GUIDE), "exec"), namespace)
    assert (tmp_path / "census-results" / "age.png").stat().st_size > 1000
