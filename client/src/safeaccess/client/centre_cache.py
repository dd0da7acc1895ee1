"""What the client keeps of a centre for working offline: the catalogue (metadata, published
row counts, the output rule set in force, the DP settings), the centre's announced signing key
and the published DP mocks it fetched, under `<safeaccess home>/centres/<hash of the URL>/`
(0700, files 0600).

Refreshed at each connection that reads the catalogue, so a researcher who connected once can
rehearse a plan on a train (`plan.rehearse()`, see `safeaccess.sandbox.mock.offline`). Nothing
here is confidential to the centre, but it says which datasets she may use: kept private.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from safeaccess.client.localstore import read_json, safeaccess_home, write_json
from safeaccess.client.metadata import split_dataset


class CentreCache:
    """The cached catalogue and mocks of the centre at `url`."""

    def __init__(self, url: str, home: Path | None = None):
        self.url = url.rstrip("/")
        digest = hashlib.sha256(self.url.encode("utf-8")).hexdigest()[:24]
        self.directory = (home if home is not None else safeaccess_home()) / "centres" / digest

    def save_catalogue(self, datasets: list[dict[str, Any]]) -> None:
        write_json(self.directory / "catalogue.json", {"url": self.url, "datasets": datasets})

    def save_health(self, health: dict[str, Any]) -> None:
        write_json(self.directory / "health.json", health)

    def health(self) -> dict[str, Any] | None:
        data = read_json(self.directory / "health.json")
        return data if isinstance(data, dict) else None

    def entry(self, dataset: str) -> dict[str, Any] | None:
        """The cached catalogue entry of `dataset` ('name@version', or the newest 'name')."""
        data = read_json(self.directory / "catalogue.json")
        if not isinstance(data, dict):
            return None
        name, version = split_dataset(dataset)
        entries = [
            d
            for d in data.get("datasets", [])
            if d.get("name") == name and (version is None or int(d["version"]) == version)
        ]
        return max(entries, key=lambda d: int(d["version"])) if entries else None

    def _mock_path(self, name: str, sha256: str) -> Path:
        return self.directory / "mocks" / f"{name}-{sha256}.json"

    def save_mock(self, name: str, payload: dict[str, Any]) -> None:
        write_json(self._mock_path(name, str(payload["manifest"]["sha256"])), payload)

    def mock(self, name: str, sha256: str) -> dict[str, Any] | None:
        """The cached mock answer whose manifest names file hash `sha256` (checked again by
        the signature when used)."""
        data = read_json(self._mock_path(name, sha256))
        return data if isinstance(data, dict) else None


__all__ = ["CentreCache"]
