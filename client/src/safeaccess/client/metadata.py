"""Dataset metadata: what a researcher may know about a dataset (never its data).

CONTRACT shared by the analysis validation, the sandbox runner, the rules and the server catalogue.
"""

from __future__ import annotations

import itertools
import math
from datetime import date
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ColumnType = Literal[
    "categorical", "ordinal", "integer", "continuous", "date", "identifier", "text"
]
#: The column types, in the order error messages list them.
COLUMN_TYPES: tuple[str, ...] = get_args(ColumnType)
#: Column types no analysis, filter, model or script ever sees: identifiers (a person number)
#: and free text (names, addresses, notes), which the sandbox's copy of the data leaves out.
HIDDEN_TYPES = ("identifier", "text")

#: A coarse share of a column's records: "none", "some" (more than none, under 5 %), or a
#: percentage rounded to a multiple of 5 (see `coarse_share` and docs/server.md).
Share = Literal["none", "some"] | int
#: The step of the published percentages.
SHARE_STEP = 5


def coarse_share(count: int, total: int) -> Share:
    """`count` of `total` records as a published share: "none", "some" (under 5 %), else the
    percentage rounded to a multiple of 5, never 0 and never 100 unless every record is."""
    if count <= 0 or total <= 0:
        return "none"
    if count >= total:
        return 100
    percent = 100.0 * count / total
    if percent < SHARE_STEP:
        return "some"
    return int(min(100 - SHARE_STEP, max(SHARE_STEP, SHARE_STEP * round(percent / SHARE_STEP))))


def coarse_level_share(count: int, total: int) -> Share:
    """A declared level's share of the records, published: "some" under 5 % (an empty level
    included, so that no one learns a level is empty), else as `coarse_share`."""
    share = coarse_share(count, total)
    return "some" if share == "none" else share


class ColumnProfile(BaseModel):
    """Coarse facts of a column computed at registration and published with the version, so a
    rehearsal's mock has missing values and exact zeros where the data has them (a log of an
    income with zeros fails on both). Absent on versions registered before it existed: the
    mock then has neither."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    missing: Share = Field(default="none", description="Share of records with no value.")
    zeros: Share | None = Field(
        default=None, description="Share of records exactly 0 (numeric columns only)."
    )
    levels: list[Share] | None = Field(
        default=None,
        description="Share of records at each declared level, in the declared order "
        "(categorical and ordinal columns with levels); 'some' includes none.",
    )

    @model_validator(mode="after")
    def _coarse(self) -> ColumnProfile:
        for share in (self.missing, self.zeros, *(self.levels or [])):
            if isinstance(share, int) and (share % SHARE_STEP or not SHARE_STEP <= share <= 100):
                raise ValueError(
                    f"a published share is 'none', 'some' or a multiple of {SHARE_STEP} "
                    f"from {SHARE_STEP} to 100, not {share}"
                )
        return self


class Column(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: ColumnType
    description: str = ""
    levels: list[str | int] | None = Field(
        default=None, description="Allowed values of a categorical/ordinal column, in order."
    )
    bounds: tuple[float, float] | None = Field(
        default=None, description="Declared (lower, upper) bounds of a numeric column."
    )
    scale: tuple[int, int] | None = Field(
        default=None, description="(lowest, highest) point of an ordinal or small-integer scale."
    )
    date_bounds: tuple[date, date] | None = Field(
        default=None,
        description="Declared (first, last) dates of a date column, written 'YYYY-MM-DD'.",
    )
    unit: str | None = Field(default=None, description="Unit of measurement, e.g. 'EUR'.")
    contributor: bool = Field(
        default=False,
        description="This column identifies the contributor unit (e.g. employer id) for "
        "dominance checks on magnitude tables.",
    )
    nullable: bool = Field(
        default=True,
        description="The column may hold missing values (synthetic data then gives it a null "
        "level; a non-nullable column never gets one).",
    )
    quasi_identifier: bool = Field(
        default=False, description="An attacker may know this column (synthetic-data checks)."
    )
    sensitive: bool = Field(
        default=False, description="A value an attacker may try to infer (synthetic-data checks)."
    )
    synth_bins: list[float] | None = Field(
        default=None,
        description="Default bin edges of a numeric column in synthetic data (inside bounds).",
    )
    profile: ColumnProfile | None = Field(
        default=None,
        description="Coarse shares of missing values and exact zeros, computed by the server "
        "at registration (a declared one is replaced); absent on older versions.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Column:
        if self.type == "date":
            if self.levels is not None or self.bounds is not None or self.scale is not None:
                raise ValueError(
                    f"column {self.name}: a date column has no levels, bounds or scale; declare "
                    "its first and last dates as date_bounds: ['YYYY-MM-DD', 'YYYY-MM-DD']"
                )
            if self.date_bounds is not None and self.date_bounds[0] > self.date_bounds[1]:
                raise ValueError(f"column {self.name}: the first date is after the last")
        elif self.date_bounds is not None:
            raise ValueError(f"column {self.name}: date_bounds apply to date columns only")
        if self.type == "text" and (
            self.levels is not None or self.bounds is not None or self.scale is not None
        ):
            raise ValueError(
                f"column {self.name}: a text column has no levels, bounds or scale (it is kept "
                "out of every analysis); declare it categorical with its levels to analyse it"
            )
        if self.bounds is not None:
            if not all(math.isfinite(b) for b in self.bounds):
                raise ValueError(f"column {self.name}: bounds must be finite numbers")
            if self.bounds[0] > self.bounds[1]:
                raise ValueError(f"column {self.name}: lower bound exceeds upper bound")
        if self.scale is not None and self.scale[0] >= self.scale[1]:
            raise ValueError(f"column {self.name}: scale must be (low, high) with low < high")
        shares = self.profile.levels if self.profile is not None else None
        if shares is not None and len(shares) != len(self.levels or []):
            raise ValueError(
                f"column {self.name}: its profile has {len(shares)} level shares for "
                f"{len(self.levels or [])} declared levels"
            )
        if self.synth_bins is not None:
            edges = self.synth_bins
            if len(edges) < 2 or any(b <= a for a, b in itertools.pairwise(edges)):
                raise ValueError(
                    f"column {self.name}: synth_bins must be at least two increasing edges"
                )
            if self.bounds is None or edges[0] < self.bounds[0] or edges[-1] > self.bounds[1]:
                raise ValueError(
                    f"column {self.name}: synth_bins must lie inside the declared bounds"
                )
        return self


class NeighbouringRelation(BaseModel):
    """What differential privacy protects on this dataset, stated once for every DP answer.

    `record`: datasets differing by adding or removing one record are neighbours. `contributor`:
    by adding or removing one contributor unit (the column marked `contributor`), with at most
    `max_records_per_unit` of its records used (the runner keeps the first ones in stored order
    and drops the rest, so the sensitivity is that many times a record's). Records whose unit is
    missing count as units of their own.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: Literal["record", "contributor"] = "record"
    max_records_per_unit: int = Field(default=1, ge=1, le=10_000)

    @property
    def records_per_unit(self) -> int:
        """How many records of one neighbouring unit a DP answer may use (the multiple of a
        record's sensitivity): `max_records_per_unit` for contributors, else one."""
        return self.max_records_per_unit if self.unit == "contributor" else 1

    @model_validator(mode="after")
    def _consistent(self) -> NeighbouringRelation:
        if self.unit == "record" and self.max_records_per_unit != 1:
            raise ValueError(
                "max_records_per_unit applies to unit 'contributor' only; for unit 'record' "
                "leave it at 1"
            )
        return self


class DatasetMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    columns: list[Column] = Field(min_length=1)
    neighbours: NeighbouringRelation = Field(
        default_factory=NeighbouringRelation,
        description="The DP neighbouring relation (what one DP answer protects).",
    )
    record_key: str | None = Field(
        default=None,
        description="The identifier column that names the same person (record) in every version "
        "of the dataset, e.g. 'person_id'. The server maps it to stable record ids for auditing "
        "query sets across versions; like every identifier it never reaches an analysis.",
    )
    version: int | None = Field(
        default=None,
        ge=1,
        description="The dataset version this metadata describes (as the catalogue lists it); "
        "None when it describes the dataset without naming a version.",
    )
    storage: Literal["memory", "duckdb"] = Field(
        default="memory",
        description="How the sandbox reads the dataset: 'memory' loads it once per version "
        "(every analysis kind); 'duckdb' queries its Parquet file out of memory inside each job, "
        "for datasets larger than a job's memory: DuckDB computes frequency tables, histograms and "
        "magnitude tables of sum or mean over the file; other kinds read only the columns they "
        "use; scripts are refused with 'storage_unsupported').",
    )

    @model_validator(mode="after")
    def _unique(self) -> DatasetMetadata:
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate column names: {', '.join(dupes)}")
        if self.neighbours.unit == "contributor" and self.contributor_column is None:
            raise ValueError(
                "neighbours.unit is 'contributor' but no column is marked contributor: true"
            )
        if self.record_key is not None:
            key = self.column(self.record_key)
            if key is None or key.type != "identifier":
                raise ValueError(
                    f"record_key {self.record_key!r} must name a column of type 'identifier'"
                )
            if key.contributor:
                raise ValueError(
                    f"record_key {self.record_key!r} cannot also be the contributor column"
                )
        return self

    @property
    def identifier_columns(self) -> list[str]:
        """Columns of type 'identifier': never visible to analyses or scripts."""
        return [c.name for c in self.columns if c.type == "identifier"]

    @property
    def text_columns(self) -> list[str]:
        """Columns of type 'text' (free text): never stored for the sandbox, never analysed."""
        return [c.name for c in self.columns if c.type == "text"]

    def column(self, name: str) -> Column | None:
        """The declared column `name`, or the part of a bounded date column `name` spells
        (`year(admitted)`, see `safeaccess.client.dateparts`): an ordinal column of integer
        levels derived from the declared date_bounds, so that tables, summaries and DP answers
        group by it as by any declared grouping column. Validation lets a part appear only
        where a grouping column may."""
        found = next((c for c in self.columns if c.name == name), None)
        if found is not None or "(" not in name:
            return found
        return self.date_part(name)

    def date_part(self, name: str) -> Column | None:
        """The derived column of date part `name` (None: not a part of a bounded date column)."""
        from safeaccess.client.dateparts import parse_part, part_levels

        parsed = parse_part(name)
        if parsed is None:
            return None
        part, base = parsed
        col = next((c for c in self.columns if c.name == base), None)
        if col is None or col.type != "date" or col.date_bounds is None:
            return None
        levels: list[str | int] = list(part_levels(part, *col.date_bounds))
        # Constructed without validation: its name is not a column name (it holds parentheses).
        return Column.model_construct(
            name=name,
            type="ordinal",
            description=f"the {part} of {base}",
            levels=levels,
            nullable=col.nullable,
        )

    @property
    def label(self) -> str:
        """`name@version`, or the bare name when the metadata names no version."""
        return self.name if self.version is None else f"{self.name}@{self.version}"

    @property
    def contributor_column(self) -> str | None:
        return next((c.name for c in self.columns if c.contributor), None)


def metadata_errors(exc: ValidationError, raw: Any = None) -> str:
    """One line for what is wrong with dataset metadata: each problem by where it is (the
    column's name where there is one) and, for an unknown column type, the supported ones."""
    problems = []
    for error in exc.errors():
        loc = list(error["loc"])
        where = ".".join(str(p) for p in loc) or "metadata"
        column = where
        if len(loc) >= 2 and loc[0] == "columns" and isinstance(loc[1], int):
            try:
                column = f"column {raw['columns'][loc[1]]['name']!r}"
                rest = ".".join(str(p) for p in loc[2:])
                where = column + (f" ({rest})" if rest else "")
            except (TypeError, KeyError, IndexError):
                pass
        if loc[-1:] == ["type"] and error["type"] == "literal_error":
            problems.append(
                f"{column}: type {error.get('input')!r} is not supported; use one of "
                f"{', '.join(COLUMN_TYPES)}"
            )
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{where}: {message}")
    return "; ".join(problems)


def split_dataset(dataset: str) -> tuple[str, int | None]:
    """'census' -> ('census', None); 'census@2' -> ('census', 2). ValueError if malformed."""
    base, sep, version = dataset.partition("@")
    if not base:
        raise ValueError("a dataset reference needs a name, e.g. 'census' or 'census@2'")
    if not sep:
        return base, None
    if not version.isdigit() or int(version) < 1:
        raise ValueError(
            f"dataset {dataset!r}: the version after '@' must be a positive number, e.g. '{base}@1'"
        )
    return base, int(version)


def check_describes(metadata: DatasetMetadata, dataset: str) -> None:
    """ValueError unless `metadata` describes `dataset` ('name' or 'name@version').

    Metadata of `people` describes `people@1` when it names no version or version 1.
    """
    base, version = split_dataset(dataset)
    if metadata.name != base:
        raise ValueError(f"the metadata describes dataset {metadata.name!r}, not {base!r}")
    if version is not None and metadata.version is not None and metadata.version != version:
        raise ValueError(
            f"the metadata describes {metadata.label}, but the plan is pinned to {dataset}; "
            "take the metadata of that version from the catalogue"
        )
