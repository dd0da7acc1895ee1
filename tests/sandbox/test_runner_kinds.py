"""The one table of analysis kinds (`safeaccess.sandbox.runner.kinds`): complete, loadable, and
its light template family free of the heavy libraries it exists to keep out."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from safeaccess.client.analyses import DP_KINDS, SYNTH_KINDS, Analysis
from safeaccess.sandbox.runner import ANALYSIS_KINDS, _compute_for
from safeaccess.sandbox.runner.compute._common import AnalysisError
from safeaccess.sandbox.runner.kinds import KINDS, family_for, preload_modules


def _client_kinds() -> set[str]:
    """Every `kind` the client's Analysis union accepts (read from its Literal fields)."""
    union = typing.get_args(Analysis)[0]
    kinds: set[str] = set()
    for model in typing.get_args(union):
        kinds.update(typing.get_args(model.model_fields["kind"].annotation))
    return kinds


def test_every_kind_a_researcher_can_send_has_exactly_one_row() -> None:
    client = _client_kinds()
    assert client >= DP_KINDS | SYNTH_KINDS
    assert set(KINDS) == client
    assert client == ANALYSIS_KINDS


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_loads_its_compute_function(kind: str) -> None:
    compute = _compute_for(kind)
    assert callable(compute)
    assert compute.__module__ == KINDS[kind].module


def test_an_unknown_kind_is_refused_and_served_by_the_full_template() -> None:
    with pytest.raises(AnalysisError) as info:
        _compute_for("no_such_kind")
    assert info.value.code == "bad_analysis"
    assert family_for("no_such_kind") == "full"
    assert family_for(None) == "full"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_kinds_template_has_imported_everything_the_kind_imports(kind: str) -> None:
    preloaded = set(preload_modules(family_for(kind)))
    assert set(KINDS[kind].modules()) <= preloaded
    assert set(preload_modules("tables")) <= set(preload_modules("full"))


def test_the_light_family_leaves_out_the_model_libraries() -> None:
    # In a fresh interpreter: this test process has imported them already.
    code = (
        "import importlib, sys\n"
        "from safeaccess.sandbox.runner.kinds import preload_modules\n"
        "for name in preload_modules('tables'):\n"
        "    importlib.import_module(name)\n"
        "heavy = ('statsmodels', 'sklearn', 'fairlearn', 'scipy.stats')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout
