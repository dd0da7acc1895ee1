"""Datasets: registering one (check the data against its metadata, store it as immutable
Parquet), each dataset's rule set, and the catalogue researchers see.

A registered dataset version never changes. Beside its Parquet file it gets, once, the integer
code arrays of its grouping columns (`safeaccess.sandbox.codes`), which the sandbox maps for
tables; `build_codes` writes them for a version registered before they existed. New data is registered as a new version of the same
name; its rows get stable record ids from the declared record key (`record_ids`), and the Parquet
the sandbox reads holds neither the key nor any identifier column.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import ValidationError

from safeaccess.client.metadata import (
    HIDDEN_TYPES,
    ColumnProfile,
    DatasetMetadata,
    coarse_level_share,
    coarse_share,
    metadata_errors,
)
from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSet, RuleSetError, load_ruleset
from safeaccess.sandbox.codes import codes_dir, sha256_file, write_codes
from safeaccess.server.config import DataDir, QssSettings, TimingConfig
from safeaccess.server.dataset_rules import current_rules_path
from safeaccess.server.errors import InvalidRequest
from safeaccess.server.qss.record_ids import (
    assign_ids,
    dropped_columns,
    pseudonyms,
    read_registry,
    sandbox_copy,
    write_ids,
)
from safeaccess.server.qss.reserved import reserved_names
from safeaccess.server.schemas import DatasetView
from safeaccess.server.steps import budgets
from safeaccess.server.steps.timing import deadline_seconds
from safeaccess.server.steps.withhold_budget import budget
from safeaccess.server.store import catalogue as registered
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import DatasetRow
from safeaccess.server.synth.mock import published_mock


def load_metadata(path: Path) -> DatasetMetadata:
    """Read dataset metadata from a JSON or YAML file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequest(f"cannot read metadata file {path}: {exc.strerror}") from exc
    try:
        raw: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidRequest(f"{path} is not valid JSON or YAML: {exc}") from exc
    try:
        return DatasetMetadata.model_validate(raw)
    except ValidationError as exc:
        # One line naming the column and what to change, not the library's dump.
        raise InvalidRequest(
            f"{path} is not valid dataset metadata: {metadata_errors(exc, raw)}"
        ) from None


def _check_csv_header(path: Path) -> None:
    """Refuse a CSV header naming a column twice, by that name: pandas would read the second as
    `age.1`, and the error would then name a column the file does not have."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        header = next(csv.reader(handle), [])
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise InvalidRequest(
            f"{path}: the header names {', '.join(repr(n) for n in repeated)} more than once; "
            "give every column its own name"
        )


def read_table(path: Path) -> pd.DataFrame:
    """Read a CSV or Parquet file."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            _check_csv_header(path)
            return pd.read_csv(path)
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read {path}: {exc}") from exc
    raise InvalidRequest(f"{path}: data must be a .csv or .parquet file")


# The strings `pandas.read_csv` reads as missing by default (its `na_values` documentation).
PANDAS_NA_MARKERS = frozenset(
    {
        "",
        "#N/A",
        "#N/A N/A",
        "#NA",
        "-1.#IND",
        "-1.#QNAN",
        "-NaN",
        "-nan",
        "1.#IND",
        "1.#QNAN",
        "<NA>",
        "N/A",
        "NA",
        "NULL",
        "NaN",
        "None",
        "n/a",
        "nan",
        "null",
    }
)


def missing_markers(path: Path) -> list[str]:
    """For a CSV file: which text markers pandas read as missing values, per column (e.g.
    'region: 12 cells "NA"'), so the controller sees that "NA" (say, a region's code) became
    missing. Empty for Parquet, which has real nulls."""
    if path.suffix.lower() != ".csv":
        return []
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    notes = []
    for column in raw.columns:
        counts = raw[column].value_counts()
        found = [(str(v), int(n)) for v, n in counts.items() if v in PANDAS_NA_MARKERS]
        if found:
            what = ", ".join(
                f"{n} cell{'s' if n != 1 else ''} {'empty' if v == '' else repr(v)}"
                for v, n in sorted(found)
            )
            notes.append(f"{column}: {what}")
    return notes


def _level_key(value: object) -> str:
    """Compare levels as text, with 3.0 read from a CSV column with gaps equal to level 3."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


#: A categorical value with this many words, or longer than this many characters, reads as free
#: text (a name and address, a note) rather than a category: "Mr Smith at 12 High St".
FREE_TEXT_WORDS = 4
FREE_TEXT_CHARS = 40


def looks_like_free_text(value: object) -> bool:
    text = str(value)
    return len(text) > FREE_TEXT_CHARS or len(text.split()) >= FREE_TEXT_WORDS


@dataclass
class _ColumnFacts:
    """What the metadata check needs to know of one column, gathered batch by batch."""

    free_text: int = 0  # values of a categorical without levels that read as free text
    not_dates: int = 0  # values of a date column that are not 'YYYY-MM-DD' dates
    out_of_dates: bool = False  # dates outside the declared date_bounds
    missing: bool = False
    n_missing: int = 0  # for the published profile (`profile()`)
    n_zeros: int = 0
    level_counts: Counter[str] = field(default_factory=Counter)
    unknown: set[str] = field(default_factory=set)
    non_numeric: bool = False
    fractional: bool = False
    low: float | None = None
    high: float | None = None


class MetadataCheck:
    """Checks data against its metadata one batch of rows at a time, so a dataset larger than
    memory is checked as it is read; `problems()` is the same list whatever the batches."""

    def __init__(self, metadata: DatasetMetadata):
        self.metadata = metadata
        self.columns: list[str] | None = None
        self.facts = {c.name: _ColumnFacts() for c in metadata.columns}
        self.rows = 0

    def add(self, frame: pd.DataFrame) -> None:
        """Take in the next rows (every batch has the same columns)."""
        if self.columns is None:
            self.columns = [str(n) for n in frame.columns]
        self.rows += len(frame)
        for column in self.metadata.columns:
            if column.name not in frame.columns:
                continue
            facts = self.facts[column.name]
            values = frame[column.name].dropna()
            facts.missing = facts.missing or len(values) < len(frame)
            facts.n_missing += len(frame) - len(values)
            if column.levels is not None:
                # Counted on the distinct values, each turned into its key once.
                for value, count in values.value_counts(sort=False).items():
                    key = _level_key(value)
                    facts.unknown.add(key)
                    facts.level_counts[key] += int(count)
            elif column.type in ("categorical", "ordinal"):
                facts.free_text += sum(looks_like_free_text(v) for v in values.unique())
            if column.type == "date":
                dates = _dates(values)
                facts.not_dates += int(dates.isna().sum())
                if column.date_bounds is not None and dates.notna().any():
                    first, last = (pd.Timestamp(d) for d in column.date_bounds)
                    facts.out_of_dates = facts.out_of_dates or bool(
                        (dates.min() < first) or (dates.max() > last)
                    )
                continue
            numeric = column.type in ("integer", "continuous") or column.bounds is not None
            if numeric and not pd.api.types.is_numeric_dtype(values):
                facts.non_numeric = True
                continue
            if not len(values):
                continue
            if column.type in ("integer", "continuous"):
                facts.n_zeros += int((values == 0).sum())
            if column.type == "integer" and not (values % 1 == 0).all():
                facts.fractional = True
            if column.bounds is not None:
                low, high = float(values.min()), float(values.max())
                facts.low = low if facts.low is None else min(facts.low, low)
                facts.high = high if facts.high is None else max(facts.high, high)

    def problems(self) -> list[str]:
        """Every way the data disagrees with its metadata (empty list: they agree)."""
        problems: list[str] = []
        present = self.columns or []
        declared = [c.name for c in self.metadata.columns]
        missing = [n for n in declared if n not in present]
        extra = [n for n in present if n not in declared]
        if missing:
            problems.append("columns described but absent from the data: " + ", ".join(missing))
        if extra:
            problems.append("columns in the data with no metadata: " + ", ".join(extra))
        for column in self.metadata.columns:
            if column.name not in present:
                continue
            facts = self.facts[column.name]
            if not column.nullable and facts.missing:
                problems.append(f"{column.name}: declared nullable: false but has missing values")
            if column.levels is not None:
                unknown = facts.unknown - {_level_key(level) for level in column.levels}
                if unknown:
                    problems.append(
                        f"{column.name}: {len(unknown)} value(s) not among its declared levels"
                    )
            if facts.not_dates:
                problems.append(
                    f"{column.name}: declared date but {facts.not_dates} value(s) are not dates "
                    "written YYYY-MM-DD"
                )
            if facts.out_of_dates and column.date_bounds is not None:
                first, last = column.date_bounds
                problems.append(
                    f"{column.name}: dates outside the declared date_bounds {first}..{last}"
                )
            if facts.free_text:
                # Its values would become table labels: released as they are.
                problems.append(
                    f"{column.name}: declared {column.type} without levels, and "
                    f"{facts.free_text} of its values read as free text (a name, an address, a "
                    "note); declare it type: text (kept out of every analysis) or list its levels"
                )
            if facts.non_numeric:
                problems.append(f"{column.name}: declared {column.type} but not numeric")
                continue
            if facts.fractional:
                problems.append(f"{column.name}: declared integer but has fractional values")
            if column.bounds is not None and facts.low is not None and facts.high is not None:
                low, high = column.bounds
                if facts.low < low or facts.high > high:
                    # Say which bound is broken, never the offending value: this message is
                    # logged.
                    problems.append(
                        f"{column.name}: values outside the declared bounds {low}..{high}"
                    )
        return problems

    def profiled(self) -> DatasetMetadata:
        """The metadata with each column's published profile (`ColumnProfile`): the shares of
        missing values and, of a numeric column, of exact zeros, coarsened by `coarse_share`
        (docs/server.md says why that is safe to publish). A declared profile is replaced."""
        columns = []
        for column in self.metadata.columns:
            if column.type in HIDDEN_TYPES:
                # No analysis sees identifiers or free text, so the mock needs nothing of them:
                # publish nothing.
                columns.append(column.model_copy(update={"profile": None}))
                continue
            facts = self.facts[column.name]
            numeric = column.type in ("integer", "continuous")
            levels = (
                [
                    coarse_level_share(facts.level_counts[_level_key(v)], self.rows)
                    for v in column.levels
                ]
                if column.levels is not None and column.type in ("categorical", "ordinal")
                else None
            )
            profile = ColumnProfile(
                missing=coarse_share(facts.n_missing, self.rows),
                zeros=coarse_share(facts.n_zeros, self.rows) if numeric else None,
                levels=levels,
            )
            columns.append(column.model_copy(update={"profile": profile}))
        return self.metadata.model_copy(update={"columns": columns})


def _dates(values: pd.Series) -> pd.Series:
    """The values of a date column as dates (NaT where one is not a 'YYYY-MM-DD' date)."""
    if pd.api.types.is_datetime64_any_dtype(values.dtype):
        return values.dt.normalize()
    return pd.to_datetime(values.astype(str), format="%Y-%m-%d", errors="coerce")


def as_dates(frame: pd.DataFrame, metadata: DatasetMetadata) -> pd.DataFrame:
    """`frame` with its date columns stored as dates (datetime64, at midnight), as the
    sandbox's copy keeps them; the check has made sure every value is one."""
    dated = [c.name for c in metadata.columns if c.type == "date" and c.name in frame.columns]
    if not dated:
        return frame
    return frame.assign(**{name: _dates(frame[name]) for name in dated})


def _dated_table(table: pa.Table, metadata: DatasetMetadata) -> pa.Table:
    """A batch of a storage "duckdb" dataset with its date columns stored as dates (timestamps
    at midnight, what `as_dates` gives in memory), whether the file held them as text or as
    dates: the filter and the date parts then read them alike on both paths."""
    for col in metadata.columns:
        if col.type == "date" and col.name in table.column_names:
            at = table.schema.get_field_index(col.name)
            dates = _dates(table.column(at).to_pandas())
            table = table.set_column(at, col.name, pa.array(dates, from_pandas=True))
    return table


def check_against_metadata(frame: pd.DataFrame, metadata: DatasetMetadata) -> list[str]:
    """Every way the data disagrees with its metadata (empty list: they agree)."""
    check = MetadataCheck(metadata)
    check.add(frame)
    return check.problems()


#: Rows read at a time when a dataset is registered from its file without loading it whole.
BATCH_ROWS = 1_000_000


class _FrameRows:
    """The rows of a dataset registered from a frame in memory."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame
        self.count = len(frame)

    def check(self, metadata: DatasetMetadata) -> MetadataCheck:
        check = MetadataCheck(metadata)
        check.add(self.frame)
        return check

    def key_frame(self, metadata: DatasetMetadata) -> pd.DataFrame:
        return self.frame

    def write_sandbox_copy(self, target: Path, metadata: DatasetMetadata) -> None:
        sandbox_copy(as_dates(self.frame, metadata), metadata).to_parquet(target, index=False)


class _ParquetRows:
    """The rows of a dataset registered from its Parquet file a batch at a time (storage
    "duckdb": larger than memory). Only the record key and the contributor column are ever
    read whole; the sandbox's copy is written batch by batch in the same row order."""

    def __init__(self, source: Path, batch_rows: int):
        if source.suffix.lower() not in (".parquet", ".pq"):
            raise InvalidRequest(
                f"{source}: a dataset with storage 'duckdb' is registered from a Parquet file "
                "(it is never loaded whole); convert the CSV to Parquet first"
            )
        try:
            self.file = pq.ParquetFile(source)
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"cannot read {source}: {exc}") from exc
        self.source = source
        self.batch_rows = batch_rows
        self.count = self.file.metadata.num_rows

    def _batches(self) -> Iterator[pa.Table]:
        for batch in self.file.iter_batches(batch_size=self.batch_rows):
            yield pa.Table.from_batches([batch])

    def _column(self, name: str) -> pd.Series:
        return pq.read_table(self.source, columns=[name]).column(name).to_pandas()

    def check(self, metadata: DatasetMetadata) -> MetadataCheck:
        check = MetadataCheck(metadata)
        check.add(self.file.schema_arrow.empty_table().to_pandas())
        for table in self._batches():
            check.add(table.to_pandas())
        return check

    def key_frame(self, metadata: DatasetMetadata) -> pd.DataFrame:
        key = metadata.record_key
        if key is None:
            return pd.DataFrame(index=pd.RangeIndex(self.count))
        return pd.DataFrame({key: self._column(key)})

    def write_sandbox_copy(self, target: Path, metadata: DatasetMetadata) -> None:
        drop = dropped_columns(metadata)
        contributor = metadata.contributor_column
        coded = (
            pseudonyms(self._column(contributor))
            if contributor is not None and contributor in metadata.identifier_columns
            else None
        )
        offset = 0
        writer: pq.ParquetWriter | None = None
        try:
            for table in self._batches():
                table = table.drop_columns(drop)
                if coded is not None and contributor is not None:
                    part = coded.iloc[offset : offset + table.num_rows]
                    table = table.set_column(
                        table.schema.get_field_index(contributor),
                        contributor,
                        pa.array(part, type=pa.int64(), from_pandas=True),
                    )
                offset += table.num_rows
                table = _dated_table(table, metadata)
                if writer is None:
                    writer = pq.ParquetWriter(target, table.schema)
                writer.write_table(table)
            if writer is None:  # no rows: the columns still
                empty = self.file.schema_arrow.empty_table().drop_columns(drop)
                pq.write_table(empty, target)
        finally:
            if writer is not None:
                writer.close()


def register_dataset(
    data: DataDir,
    store: Database,
    *,
    name: str,
    metadata: DatasetMetadata,
    project: str,
    frame: pd.DataFrame | None = None,
    source: Path | None = None,
    rules_file: Path | None = None,
    qss: QssSettings | None = None,
    batch_rows: int = BATCH_ROWS,
) -> DatasetRow:
    """Check and store a new immutable version of dataset `name`; return its row.

    The data is `frame`, or the Parquet file `source` read `batch_rows` at a time (for a
    dataset with storage "duckdb", which never fits in the server's memory either)."""
    rows: _FrameRows | _ParquetRows
    if frame is not None and source is None:
        rows = _FrameRows(frame)
    elif source is not None and frame is None:
        rows = _ParquetRows(source, batch_rows)
    else:
        raise InvalidRequest("register a dataset from a frame or from a file: one of the two")
    if metadata.name != name:
        raise InvalidRequest(f"the metadata describes dataset {metadata.name!r}, not {name!r}")
    if not registered.project_exists(store, project):
        raise InvalidRequest(
            f"project {project!r} does not exist; add it with 'safeaccess-server project add'"
        )
    checked = rows.check(metadata)
    problems = checked.problems()
    if problems:
        raise InvalidRequest("the data does not match its metadata: " + "; ".join(problems))
    # Published with the version for the rehearsal's mock (docs/server.md, "Column profiles").
    metadata = checked.profiled()
    if rules_file is not None:
        try:
            load_ruleset(rules_file, base=DEFAULT_RULESET)
        except (RuleSetError, OSError) as exc:
            raise InvalidRequest(f"rule set {rules_file}: {exc}") from exc
    version = registered.next_dataset_version(store, name)
    if metadata.version is not None and metadata.version != version:
        # a researcher's plan pinned to `name@N` is checked against metadata that says N
        raise InvalidRequest(
            f"the metadata says it describes {metadata.label}, but this registration makes "
            f"version {version}; remove the metadata's version or set it to {version}"
        )
    folder = data.datasets / name
    previous = None
    if version > 1:
        prior = registered.find_dataset(store, name, version - 1)
        previous = None if prior is None else data.root / prior.path
    record_ids = assign_ids(
        name,
        rows.key_frame(metadata),
        metadata,
        previous_version=version - 1 if version > 1 else None,
        previous_registry=None if previous is None else read_registry(previous),
    )
    qss_settings = registered.resolve_qss_settings(store, name, qss)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"v{version}.parquet"
    if target.exists():
        raise InvalidRequest(f"{target} exists but is not registered; remove it and retry")
    tmp = folder / f".v{version}.parquet.tmp"
    # Row order is kept exactly: query sets index rows by position in this file, and
    # `v{n}.ids.npy` maps those positions to stable record ids.
    try:
        rows.write_sandbox_copy(tmp, metadata)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    os.chmod(target, 0o440)
    id_files = write_ids(target, record_ids)
    codes = codes_dir(target)
    rules_rel: str | None = None
    if rules_file is not None:
        rules_target = folder / f"v{version}.rules.yaml"
        shutil.copyfile(rules_file, rules_target)
        os.chmod(rules_target, 0o440)
        rules_rel = str(rules_target.relative_to(data.root))
    try:
        if metadata.storage == "memory":
            # Once per version, never at step time: worker hosts may see the data directory
            # read-only. A "duckdb" version is never loaded whole, so it gets none.
            write_codes(target, metadata)
        return registered.add_dataset(
            store,
            name=name,
            version=version,
            project=project,
            path=str(target.relative_to(data.root)),
            sha256=sha256_file(target),
            rows=rows.count,
            metadata=metadata.model_dump(mode="json"),
            rules_path=rules_rel,
            qss=qss_settings,
        )
    except Exception:
        # Not recorded: remove the files so a retry can write them again.
        target.unlink(missing_ok=True)
        shutil.rmtree(codes, ignore_errors=True)
        for path in id_files:
            path.unlink(missing_ok=True)
        if rules_rel is not None:
            (data.root / rules_rel).unlink(missing_ok=True)
        raise


def build_codes(data: DataDir, store: Database, name: str, version: int | None = None) -> Path:
    """(Re)write the code arrays of a registered dataset version (default: the newest), e.g.
    one registered before versions had them; return their directory. The Parquet file must
    still have the digest recorded at registration."""
    row = registered.find_dataset(store, name, version)
    if row is None:
        which = name if version is None else f"{name}@{version}"
        raise InvalidRequest(f"no dataset {which}; 'dataset list' shows the registered ones")
    metadata = DatasetMetadata.model_validate(row.dataset_metadata)
    if metadata.storage != "memory":
        raise InvalidRequest(
            f"{row.name}@{row.version} has storage {metadata.storage!r}: its jobs never load it, "
            "so it has no code arrays"
        )
    parquet = data.root / row.path
    if not parquet.is_file() or sha256_file(parquet) != row.sha256:
        raise InvalidRequest(
            f"{row.path} is missing or differs from what was registered; nothing was written"
        )
    return write_codes(parquet, metadata)


class Rulesets:
    """Each dataset's rule set: its override file on top of the defaults, else the defaults
    (each file read once)."""

    def __init__(self, store: Database, root: Path):
        self.store = store
        self.root = root
        self._loaded: dict[str, RuleSet] = {}

    def ruleset_for(self, dataset: DatasetRow) -> RuleSet:
        """The dataset's rule set, read from its current override file."""
        # Read the path now, not from the (cached) row: `dataset rules` may have changed it.
        path = current_rules_path(self.store, dataset.id)
        if path is None:
            return DEFAULT_RULESET
        cached = self._loaded.get(path)
        if cached is None:
            cached = load_ruleset(self.root / path, base=DEFAULT_RULESET)
            self._loaded[path] = cached
        return cached


def catalogue(
    store: Database,
    data: DataDir,
    ruleset_for: Callable[[DatasetRow], RuleSet],
    researcher: str,
    timing: TimingConfig | None = None,
    *,
    reserve: bool = False,
) -> list[DatasetView]:
    """Datasets of the researcher's projects: names, descriptions, column metadata, no data;
    with reply padding (`timing`), each version's reply deadline; with `reserve` (the centre's
    `reserve_standard_tables`), the standard tables a shared span scope reserves."""
    views = []
    for row in registered.datasets_for(store, researcher):
        meta = DatasetMetadata.model_validate(row.dataset_metadata)
        rs = ruleset_for(row)
        qss = registered.qss_settings(store, row.name) if reserve else None
        shared = qss is not None and qss.scope != "researcher" and qss.mode == "span"
        views.append(
            DatasetView(
                name=row.name,
                version=row.version,
                project=row.project,
                description=meta.description,
                rows=row.rows,
                columns=[c.model_dump(mode="json") for c in meta.columns],
                ruleset=rs.label,
                rules={**rs.model_dump(mode="json"), "sha256": rs.content_hash()},
                neighbours=meta.neighbours.model_dump(mode="json"),
                storage=meta.storage,
                reply_deadline_seconds=(
                    deadline_seconds(timing, row.rows)
                    if timing is not None and timing.pad
                    else None
                ),
                dp=registered.get_dp_config(store, row.name),
                dp_budget=budgets.dp_budget(store, row, researcher),
                withhold_budget=budget(store, rs, researcher, row.name),
                mock=published_mock(data, row.path, row.version),
                reserved_tables=reserved_names(meta) if shared else [],
            )
        )
    return views
