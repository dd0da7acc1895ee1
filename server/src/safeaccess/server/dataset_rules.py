"""Changing a dataset version's rule set without registering its data again.

The new rule set (YAML over the defaults, as at registration) is checked, copied read-only next
to the data under a name carrying its hash (the file a past decision was made with is never
overwritten), recorded on the dataset version and in the audit log. A running server reads the
version's rule-set path at each use (`current_rules_path`), so the change applies from the next
step on without a restart; every decision names the rule set (label and hash) it was made with.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSetError, load_ruleset
from safeaccess.server.config import DataDir
from safeaccess.server.errors import InvalidRequest, NotFound
from safeaccess.server.store import auditlog, catalogue, step_settings
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import DatasetRow


def current_rules_path(store: Database, dataset_id: int) -> str | None:
    """The rule-set file of a dataset version as recorded now (None: the default rules); in a
    request's settings scope, as recorded when the request first needed it."""
    if step_settings.in_scope(store):
        settings = step_settings.settings_of(store, dataset_id)
        if settings is None:
            raise NotFound(f"dataset id {dataset_id} does not exist")
        return settings.rules_path
    with store.one_statement() as conn:
        return catalogue.rules_path(conn, dataset_id)


def set_rules(
    data: DataDir, store: Database, name: str, file: Path, *, version: int | None = None
) -> tuple[DatasetRow, str, str]:
    """Give dataset `name` (its newest version, or `version`) the rule set in `file`; returns
    the row, the rule set's label and the file's SHA-256. Bad input changes nothing."""
    try:
        ruleset = load_ruleset(file, base=DEFAULT_RULESET)
    except (RuleSetError, OSError) as exc:
        raise InvalidRequest(f"rule set {file}: {exc}") from exc
    row = catalogue.find_dataset(store, name, version)
    if row is None:
        which = f"{name}@{version}" if version is not None else name
        raise NotFound(f"dataset {which} is not registered (see 'safeaccess-server dataset list')")
    content = file.read_bytes()
    digest = hashlib.sha256(content).hexdigest()
    target = data.datasets / name / f"v{row.version}.rules.{digest[:12]}.yaml"
    if not target.exists():
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(file, tmp)
        os.chmod(tmp, 0o440)
        os.replace(tmp, target)
    relative = str(target.relative_to(data.root))
    with store.transaction() as s:
        catalogue.set_rules_path(s, row.id, relative)
        auditlog.append(
            s,
            "dataset_rules_changed",
            "admin",
            {
                "dataset": name,
                "version": row.version,
                "ruleset": ruleset.label,
                "ruleset_hash": ruleset.content_hash(),
                "file_sha256": digest,
            },
        )
    return row, ruleset.label, digest
