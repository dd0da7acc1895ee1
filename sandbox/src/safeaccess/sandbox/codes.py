"""A dataset version's integer code arrays: written once at registration, memory-mapped by jobs.

Beside `vN.parquet` the server writes a directory `vN.codes/` holding, for each column that a
table may group by (declared levels, or a small set of distinct values), one `.npy` array of
the smallest signed integer type with each record's code, and `manifest.json`: per column its
levels (in the server's level rule, `safeaccess.rules.tabulate.code_levels`, applied to the
whole stored dataset), how many of them are declared (`fixed`), the dtype and the SHA-256 of the
array file; and the row count and SHA-256 of the Parquet file they were made from. Code -1 is
reserved for a missing value.

Why store codes: a table at 10 M rows spends most of its time turning values into codes
(`pd.factorize`); `np.bincount` on stored int8/int16 codes is an order of magnitude faster, and a
memory-mapped array is shared by every job forked from a template without a copy.

The writer runs on the host (`write_codes`); a template opens the files while it still holds
the host's privileges and maps them afterwards (`map_codes`), checking every digest, so a job
never reads codes of another dataset version. Nothing here is ever written at step time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import Label
from safeaccess.rules.tabulate import code_levels

MANIFEST = "manifest.json"
FORMAT = 1
#: Columns with more distinct values than this are not coded: a table by them is refused anyway
#: (more cells than the sandbox's limit), and their codes would not fit a small type.
MAX_LEVELS = 100_000
#: Column types a table groups by ("continuous" and "identifier" are not).
GROUPING_TYPES = frozenset({"categorical", "ordinal", "integer"})
_TYPES = (np.int8, np.int16, np.int32)


class CodesError(ValueError):
    """Code arrays that do not belong to the dataset or do not match their manifest."""


def codes_dir(parquet: Path) -> Path:
    """Where the code arrays of the dataset version stored at `parquet` live (`vN.codes`)."""
    return parquet.with_name(parquet.name.removesuffix(".parquet") + ".codes")


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _smallest(n_levels: int) -> type[np.signedinteger[Any]]:
    for t in _TYPES:
        if n_levels <= np.iinfo(t).max:
            return t
    raise CodesError("too many levels for a code array")


def _n_fixed(frame: pd.DataFrame, name: str, declared: list[Label] | None) -> int:
    """How many leading levels the server's rule keeps whatever the records: the declared ones,
    else a Categorical's categories (duplicates counted once, as `code_levels` does)."""
    if declared:
        return len(dict.fromkeys(declared))
    column = frame[name]
    if isinstance(column.dtype, pd.CategoricalDtype):
        return len(column.cat.categories)
    return 0


def _codable(meta: Any, declared: list[Label] | None) -> bool:
    """Whether the column gets codes, decided by the published metadata alone: declared levels,
    or a grouping type (categorical, ordinal, integer). Which columns are coded changes how long
    a table takes, so a rule on the data (a column's dtype, how many values it has) would tell a
    researcher timing a table something the metadata does not. (A grouping column whose codes
    cannot be exact, more than MAX_LEVELS values or undeclared values without an order, stays
    uncoded: a table on it has more cells than any rule set releases.)"""
    return bool(declared) or (meta is not None and meta.type in GROUPING_TYPES)


def _coded_column(frame: pd.DataFrame, name: str, declared: list[Label] | None) -> Any:
    """(codes, levels, fixed) of one column, or None when its codes could not be exact for every
    selection (undeclared values that do not sort among themselves)."""
    codes, levels = code_levels(frame[name], declared)
    fixed = _n_fixed(frame, name, declared)
    extra = levels[fixed:]
    try:
        # A selection's undeclared values are sorted afresh: only a total order keeps them in
        # the same order as in the whole dataset.
        if sorted(extra) != extra:  # type: ignore[type-var]
            return None
    except TypeError:
        return None
    if len(levels) > MAX_LEVELS:
        return None
    return codes.astype(_smallest(len(levels))), levels, fixed


def write_codes(parquet: Path, metadata: DatasetMetadata) -> Path:
    """Write (or rewrite) the code arrays of the dataset stored at `parquet`; return their
    directory. The columns are read back from the Parquet file itself, exactly as a template
    decodes it, so the codes are those a job would compute."""
    import pyarrow.parquet as pq

    frame = pq.read_table(parquet).to_pandas()
    target = codes_dir(parquet)
    tmp = target.with_name("." + target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    columns: dict[str, Any] = {}
    for name in map(str, frame.columns):
        meta = metadata.column(name)
        declared: list[Label] | None = (
            list(meta.levels) if meta is not None and meta.levels else None
        )
        if meta is not None and meta.type in ("identifier", "continuous", "date"):
            continue
        if not _codable(meta, declared):
            continue
        try:
            coded = _coded_column(frame, name, declared)
        except (TypeError, ValueError):
            coded = None  # values the level rule cannot order: such a column stays uncoded
        if coded is None:
            continue
        codes, levels, fixed = coded
        file = f"{len(columns)}.npy"  # column names are not file names
        np.save(tmp / file, np.ascontiguousarray(codes), allow_pickle=False)
        columns[name] = {
            "file": file,
            "dtype": codes.dtype.name,
            "levels": levels,
            "fixed": fixed,
            "sha256": sha256_file(tmp / file),
        }
    manifest = {
        "format": FORMAT,
        "dataset_sha256": sha256_file(parquet),
        "rows": len(frame),
        "columns": columns,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True), encoding="utf-8")
    for child in tmp.iterdir():
        os.chmod(child, 0o440)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


@dataclass(frozen=True)
class CodeColumn:
    """One column's codes (a read-only memory map), its levels and how many are declared."""

    codes: np.ndarray
    levels: list[Label]
    fixed: int


@dataclass(frozen=True)
class CodeArrays:
    """A dataset version's code arrays by column name."""

    rows: int
    columns: Mapping[str, CodeColumn]


def _memmap(fh: IO[bytes], dtype: str, rows: int) -> np.ndarray:
    """A read-only map of a `.npy` file given as an open file (`np.load(mmap_mode="r")` needs
    a path, which a template may no longer be allowed to open)."""
    version = np.lib.format.read_magic(fh)
    read = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
    }.get(version)
    if read is None:
        raise CodesError("a code array has an unknown .npy version")
    shape, fortran, stored = read(fh)
    if shape != (rows,) or fortran or stored != np.dtype(dtype):
        raise CodesError("a code array does not match its manifest")
    return np.memmap(fh, dtype=stored, mode="r", offset=fh.tell(), shape=shape)


def map_codes(files: Mapping[str, int], dataset_sha256: str) -> CodeArrays:
    """Map the opened code arrays (descriptors are closed) after checking that they were made
    from the dataset whose digest is `dataset_sha256` and that every array has its digest."""
    handles = {name: os.fdopen(fd, "rb") for name, fd in files.items()}
    try:
        if MANIFEST not in handles:
            raise CodesError("no manifest")
        manifest = json.loads(handles[MANIFEST].read())
        if manifest.get("format") != FORMAT or manifest.get("dataset_sha256") != dataset_sha256:
            raise CodesError("the code arrays were made from another dataset")
        rows = int(manifest["rows"])
        columns = {}
        for name, entry in manifest["columns"].items():
            fh = handles[entry["file"]]
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
            if digest != entry["sha256"]:
                raise CodesError(f"code array of {name} does not match its digest")
            fh.seek(0)
            # a plain ndarray view: numpy's memmap subclass slows every operation on it
            codes = _memmap(fh, entry["dtype"], rows).view(np.ndarray)
            columns[name] = CodeColumn(codes, list(entry["levels"]), int(entry["fixed"]))
        return CodeArrays(rows=rows, columns=columns)
    except (KeyError, ValueError, TypeError) as exc:
        raise CodesError(f"unreadable code arrays: {exc}") from None
    finally:
        for fh in handles.values():
            fh.close()  # a memory map keeps its own reference to the file


def load_codes(parquet: Path) -> CodeArrays | None:
    """The code arrays of the dataset stored at `parquet` (None: none written), checked."""
    directory = codes_dir(parquet)
    if not (directory / MANIFEST).is_file():
        return None
    files = {p.name: os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in directory.iterdir()}
    return map_codes(files, sha256_file(parquet))
