"""The Grafana dashboard shipped in deploy/ asks only for metrics the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import safeaccess.server.metrics  # noqa: F401  (registers the metrics)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "safeaccess-dashboard.json"
#: What the queue collector reports at scrape time (no database here to collect from).
COLLECTED = {"safeaccess_jobs", "safeaccess_worker_heartbeat_age_seconds"}


def test_every_metric_of_the_dashboard_is_exported() -> None:
    exported = set(COLLECTED)
    for family in REGISTRY.collect():
        exported.update(sample.name for sample in family.samples)
        exported.add(family.name)
        # a histogram's series exist once observed: name them from the family
        if family.type == "histogram":
            exported.update(f"{family.name}_{s}" for s in ("bucket", "count", "sum"))
        if family.type == "counter":
            exported.add(f"{family.name}_total")
    dashboard = json.loads(DASHBOARD.read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(safeaccess_[a-z_]+)", target["expr"])
    }
    assert used, "the dashboard queries no safeaccess metric"
    assert used <= exported, used - exported
