"""The local journal of sealed sequences: every sealed sequence the client runs is kept under
the researcher's safeaccess directory (`sequences/`, files 0600), so that a sequence stopped at a
step in review can be resumed later (`session.resume(sequence_id)`, `safeaccess resume ID`) even
when she never wrote the sealed file anywhere herself.

Without the sealed file the remaining traces and bodies exist nowhere: the centre holds only what
was revealed, so a lost file would leave the sequence open for good. An entry is named by the
SHA-256 of the signed header (what the centre lists as `header_sha256`) and records the centre's
URL and, once the centre assigned one, the sequence id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safeaccess.client.localstore import private_dir, read_json, safeaccess_home, write_json
from safeaccess.client.protocol.errors import ProtocolError
from safeaccess.client.protocol.sealed import SealedSequence


@dataclass(frozen=True)
class JournalEntry:
    """One kept sealed sequence."""

    path: Path
    header_sha256: str
    server_url: str
    researcher: str
    sequence_id: str | None
    sealed: SealedSequence


def header_digest(sealed: SealedSequence) -> str:
    return hashlib.sha256(sealed.header).hexdigest()


class Journal:
    """The sealed sequences kept in `directory` (default: `<safeaccess home>/sequences`)."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory if directory is not None else safeaccess_home() / "sequences"

    def _path(self, digest: str) -> Path:
        return self.directory / f"{digest}.json"

    def record(
        self,
        sealed: SealedSequence,
        *,
        server_url: str,
        researcher: str,
        sequence_id: str | None = None,
    ) -> Path:
        """Keep `sealed` (once; later calls only add the sequence id when it becomes known)."""
        digest = header_digest(sealed)
        path = self._path(digest)
        kept = read_json(path)
        if isinstance(kept, dict) and (sequence_id is None or kept.get("sequence_id")):
            return path
        write_json(
            path,
            {
                "header_sha256": digest,
                "server_url": server_url,
                "researcher": researcher,
                "sequence_id": sequence_id,
                "sealed": sealed.to_json(),
            },
        )
        return path

    def _load(self, path: Path) -> JournalEntry | None:
        data: Any = read_json(path)
        if not isinstance(data, dict):
            return None
        try:
            sealed = SealedSequence.from_json(str(data["sealed"]))
            return JournalEntry(
                path=path,
                header_sha256=str(data["header_sha256"]),
                server_url=str(data["server_url"]),
                researcher=str(data["researcher"]),
                sequence_id=data.get("sequence_id"),
                sealed=sealed,
            )
        except (KeyError, TypeError, ValueError, ProtocolError):
            return None  # a damaged entry is skipped; the sealed file itself may still exist

    def by_digest(self, digest: str) -> JournalEntry | None:
        path = self._path(digest)
        return self._load(path) if path.exists() else None

    def entries(self) -> list[JournalEntry]:
        if not self.directory.is_dir():
            return []
        found = (self._load(p) for p in sorted(self.directory.glob("*.json")))
        return [e for e in found if e is not None]

    def ensure(self) -> Path:
        return private_dir(self.directory)


__all__ = ["Journal", "JournalEntry", "header_digest"]
