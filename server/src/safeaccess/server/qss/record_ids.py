"""Stable record ids across the versions of a dataset, and the copy of the data the sandbox sees.

The query-set auditor keeps one state per scope over *record ids*. For that state to span dataset
versions, the same person must have the same id in every version, and a person removed in v2 must
keep the id she had in v1 (otherwise "the table on v1 minus the table on v2" would not be seen for
what it is: an aggregate over the removed person). So the dataset declares a record-key column
(`DatasetMetadata.record_key`), and at registration each key is mapped to a stable id: known keys
keep theirs, new keys get the next free ids.

Files beside each version's Parquet, in the dataset's folder (server side only, never mounted
into the sandbox):

- `v{n}.ids.npy`: int32, one entry per stored row: the stable record id of that row;
- `v{n}.keys.parquet`: the key -> id registry after version n (every key ever seen, so a removed
  record keeps its id if it comes back).

The Parquet the sandbox reads has no record key and no identifier columns; an identifier that is
the contributor unit of dominance checks (e.g. an employer id) is replaced by a pseudonymous code
in random order, which keeps "which records share a contributor" and nothing else.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.server.errors import InvalidRequest

KEY = "key"
ID = "id"


def ids_path(parquet: Path) -> Path:
    """The positions -> stable id array of a version, from its Parquet path."""
    return parquet.with_name(parquet.name.removesuffix(".parquet") + ".ids.npy")


def registry_path(parquet: Path) -> Path:
    return parquet.with_name(parquet.name.removesuffix(".parquet") + ".keys.parquet")


@dataclass(frozen=True)
class RecordIds:
    """Stable ids of one version's rows and the registry after it."""

    ids: np.ndarray  # int32, per stored row
    registry: pd.DataFrame | None  # columns key, id; None for a dataset without a record key


def _normalised(keys: pd.Series) -> pd.Series:
    """Keys as int64 when they are whole numbers (a CSV with gaps reads 3 as 3.0), else text."""
    if pd.api.types.is_integer_dtype(keys):
        return keys.astype("int64").reset_index(drop=True)
    if pd.api.types.is_float_dtype(keys) and bool((keys % 1 == 0).all()):
        return keys.astype("int64").reset_index(drop=True)
    return keys.astype(str).reset_index(drop=True)


def assign_ids(
    name: str,
    frame: pd.DataFrame,
    metadata: DatasetMetadata,
    *,
    previous_version: int | None,
    previous_registry: pd.DataFrame | None,
) -> RecordIds:
    """Stable ids for `frame`'s rows; refuses what would break identity across versions."""
    key = metadata.record_key
    if key is None:
        if previous_version is not None:
            raise InvalidRequest(
                f"dataset {name!r} already has version {previous_version}; a further version "
                "needs a declared record key (metadata 'record_key', an identifier column such "
                "as person_id) so that each person keeps one record id across versions. Without "
                "it the query-set auditor could not tell that the same table on two versions "
                "isolates the people added or removed between them"
            )
        return RecordIds(ids=np.arange(len(frame), dtype=np.int32), registry=None)
    if previous_version is not None and previous_registry is None:
        raise InvalidRequest(
            f"dataset {name!r} version {previous_version} was registered without a record key, "
            "so its records cannot be matched to this version's; register the data under a new "
            "dataset name"
        )
    keys = frame[key]
    if bool(keys.isna().any()):
        raise InvalidRequest(f"record key {key!r} has missing values; every record needs a key")
    keys = _normalised(keys)
    if bool(keys.duplicated().any()):
        raise InvalidRequest(f"record key {key!r} is not unique: some key names several records")
    if previous_registry is None:
        ids = np.arange(len(keys), dtype=np.int64)
        registry = pd.DataFrame({KEY: keys, ID: ids})
    else:
        known = previous_registry[KEY]
        if known.dtype != keys.dtype:
            known, keys = known.astype(str), keys.astype(str)
        ids = pd.Index(known).get_indexer(keys).astype(np.int64)
        fresh = ids < 0
        start = len(previous_registry)
        ids[fresh] = start + np.arange(int(fresh.sum()), dtype=np.int64)
        registry = pd.concat(
            [
                pd.DataFrame({KEY: known, ID: previous_registry[ID].to_numpy()}),
                pd.DataFrame({KEY: keys[fresh].reset_index(drop=True), ID: ids[fresh]}),
            ],
            ignore_index=True,
        )
    if len(registry) > np.iinfo(np.int32).max:
        raise InvalidRequest("the dataset has more record keys than record ids can number")
    return RecordIds(ids=ids.astype(np.int32), registry=registry)


def pseudonyms(values: pd.Series) -> pd.Series:
    """A contributor column's pseudonymous codes: 0..k-1 in random order, missing kept missing,
    so only "which records share a contributor" survives."""
    codes, uniques = pd.factorize(values)
    order = np.random.default_rng(secrets.randbits(64)).permutation(len(uniques))
    coded = np.where(codes >= 0, order[np.maximum(codes, 0)], -1)
    return pd.Series(coded, dtype="Int64").mask(codes < 0)


def dropped_columns(metadata: DatasetMetadata) -> list[str]:
    """The columns the sandbox's copy leaves out: identifiers (all but the contributor's) and
    free text, so that no analysis or script can ever read them."""
    identifiers = [n for n in metadata.identifier_columns if n != metadata.contributor_column]
    return identifiers + metadata.text_columns


def sandbox_copy(frame: pd.DataFrame, metadata: DatasetMetadata) -> pd.DataFrame:
    """The data as the sandbox sees it: no record key, no identifiers, pseudonymous contributors."""
    out = frame.reset_index(drop=True).drop(columns=dropped_columns(metadata))
    contributor = metadata.contributor_column
    if contributor is not None and contributor in metadata.identifier_columns:
        out[contributor] = pseudonyms(out[contributor])
    return out


def write_ids(parquet: Path, record_ids: RecordIds) -> list[Path]:
    """Write a version's id array (and registry) beside its Parquet; returns the files written."""
    written = []
    target = ids_path(parquet)
    tmp = target.with_name("." + target.name + ".tmp")
    with tmp.open("wb") as fh:
        np.save(fh, record_ids.ids)
    os.replace(tmp, target)
    os.chmod(target, 0o440)
    written.append(target)
    if record_ids.registry is not None:
        reg = registry_path(parquet)
        tmp = reg.with_name("." + reg.name + ".tmp")
        record_ids.registry.to_parquet(tmp, index=False)
        os.replace(tmp, reg)
        os.chmod(reg, 0o440)
        written.append(reg)
    return written


def read_registry(parquet: Path) -> pd.DataFrame | None:
    path = registry_path(parquet)
    return pd.read_parquet(path) if path.is_file() else None


def read_ids(parquet: Path, rows: int) -> np.ndarray:
    """A version's stable ids (positions for versions registered before record keys existed)."""
    path = ids_path(parquet)
    if not path.is_file():
        return np.arange(rows, dtype=np.int32)
    ids: np.ndarray = np.load(path, allow_pickle=False)
    return ids
