"""How a dataset's releases are audited across outputs: the query-set auditor's settings.

Set per dataset name (so they span its versions) when its first version is registered:

- `mode`: `span` (default; refuse what would *determine* an aggregate over fewer than k records)
  or `atoms` (refuse what would create a non-empty atom of fewer than k records);
- `scope`: whose releases are audited together: `researcher`, `project` (default: colleagues in
  one project share a state, so they cannot collude) or `dataset` (everyone);
- `atom_cap`: an output that would split the partition into more atoms than this is refused for
  cost, under that name (span mode never switches to another rule).

k is the threshold of the dataset's rule set.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Scope = Literal["researcher", "project", "dataset"]


class QssSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["span", "atoms"] = "span"
    scope: Scope = "project"
    atom_cap: int = Field(default=2_000_000, ge=1)


DEFAULT_QSS = QssSettings()


def scope_key(dataset: str, scope: Scope, *, researcher: str, project: str) -> str:
    """The name of the auditor state a step is admitted against (one per scope, all versions)."""
    if scope == "researcher":
        return f"{dataset}/researcher/{researcher}"
    if scope == "project":
        return f"{dataset}/project/{project}"
    return f"{dataset}/dataset"


def scope_folder(key: str) -> str:
    """A file-system-safe folder name for a scope's state files."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
