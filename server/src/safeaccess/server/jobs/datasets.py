"""A worker host reads datasets from shared storage, read-only, and trusts none it has not
checked: before the first job on a dataset version (which starts its sandbox templates), the
file's SHA-256 must equal the one registered in the catalogue. A file changed or damaged on
the shared storage makes the job fail as the centre's fault (`Unavailable`), never a wrong
answer computed from other data than the receipt names."""

from __future__ import annotations

import threading
from pathlib import Path

from safeaccess.sandbox.codes import sha256_file
from safeaccess.server.errors import Unavailable
from safeaccess.server.store.schema import DatasetRow


class DatasetCheck:
    """The dataset versions this worker has checked, with the file's size and mtime then (a
    file replaced afterwards is checked again)."""

    def __init__(self, data_root: Path):
        self.data_root = data_root
        self._checked: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def verify(self, dataset: DatasetRow) -> None:
        """Raise `Unavailable` unless the dataset's file is the one registered."""
        path = self.data_root / dataset.path
        try:
            stat = path.stat()
        except OSError as exc:
            raise Unavailable(
                f"dataset {dataset.name} v{dataset.version} is not readable "
                f"on this worker's storage: {exc.strerror}"
            ) from exc
        seen = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if self._checked.get(dataset.id) == seen:
                return
        if sha256_file(path) != dataset.sha256:
            raise Unavailable(
                f"dataset {dataset.name} v{dataset.version} on this worker's storage does not "
                "match its registered SHA-256; no job runs on it"
            )
        with self._lock:
            self._checked[dataset.id] = seen


def unreadable(data_root: Path, datasets: list[DatasetRow]) -> list[str]:
    """The files of `datasets` this process cannot open for reading (the data, its record ids
    and its key registry), each as "path: reason". Opened, not merely `os.access`ed: a root
    worker on a root-squashed NFS mount passes `access` and still cannot read."""
    from safeaccess.server.qss.record_ids import ids_path

    problems = []
    for dataset in datasets:
        data = data_root / dataset.path
        for path in (data, ids_path(data)):
            try:
                with path.open("rb") as fh:
                    fh.read(1)
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror or exc}")
    return problems
