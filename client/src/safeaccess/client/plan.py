"""A fluent builder for the sequence of analyses a researcher binds herself to.

    plan = Plan("census@2", metadata)          # version 2 of census, checked against its metadata
    plan.frequency_table(rows="region", cols="sex", where="age >= 18")
    plan.ols("log(income) ~ age + C(sex)", where="age >= 18")
    sealed = plan.seal(key, researcher="alice", project="p1", server="tre.example")

With a session the metadata and the sealing details come from the server:
`plan = session.plan("census@2")`, `sealed = session.seal(plan)`.

Each method checks its own arguments at once (the analysis schema, the filter and formula grammar
and, when the plan knows the dataset's metadata, the columns and types), so a mistake is reported
where it is made and never enters the plan.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, overload

from pydantic import ValidationError

from safeaccess.client import protocol
from safeaccess.client.analyses import (
    Analysis,
    Correlation,
    DPCount,
    DPHistogram,
    DPMean,
    DPMeanTest,
    DPSum,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    Mitigations,
    ModelParams,
    ModelTraining,
    Regression,
    Script,
    StatTest,
    Summary,
    SummaryStatistic,
    Survival,
    SyntheticData,
    to_body,
)
from safeaccess.client.analysis_errors import problems_from
from safeaccess.client.metadata import DatasetMetadata, check_describes, split_dataset
from safeaccess.client.validation import AnalysisInvalid, Problem, check_grammar, validate

if TYPE_CHECKING:
    import pandas as pd
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from safeaccess.client.rehearsal import Rehearsal

Columns = str | Sequence[str]

_DATA_EDGES = (
    "'bins' without 'edges' would take the outer bin edges from the data (its minimum and "
    "maximum), which the output rules always withhold; give edges=[...] yourself, or use "
    "plan.histogram(variable, bins=N) on a column with declared bounds"
)


def _names(value: Columns | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [value]  # a non-name is then reported by the schema
    return list(value)


class Plan:
    """An ordered list of analyses on one dataset, to be validated and sealed.

    `dataset` is a name (`census`: the server runs the newest version when the sequence is
    opened) or a pinned version (`census@2`: that version only, or the open is refused). The
    header carries it as given; the step results say which version ran.
    """

    def __init__(self, dataset: str, metadata: DatasetMetadata | None = None) -> None:
        if not dataset:
            raise ValueError("a plan needs the name of the dataset it analyses")
        self.name, self.version = split_dataset(dataset)
        if metadata is not None:
            check_describes(metadata, dataset)
        self.dataset = dataset
        self.metadata = metadata
        self._analyses: list[Analysis] = []
        # The session that made the plan (`session.plan`), for `rehearse`; None otherwise.
        self.session: Any = None

    # ------------------------------------------------------------------------------ contents

    @property
    def analyses(self) -> tuple[Analysis, ...]:
        """The analyses in the order they will be revealed."""
        return tuple(self._analyses)

    def __len__(self) -> int:
        return len(self._analyses)

    def __iter__(self) -> Iterator[Analysis]:
        return iter(tuple(self._analyses))

    def _repr_html_(self) -> str:
        from safeaccess.client.notebook import plan_html

        return plan_html(self)

    def bodies(self) -> list[bytes]:
        """The canonical JSON body (RFC 8785) of each analysis, in order."""
        return [to_body(a) for a in self._analyses]

    def add(self, analysis: Analysis) -> Plan:
        """Append an analysis model, checked against the metadata when the plan has it and
        against the filter and formula grammar always.

        Refused here too: what the analysis alone dooms to a withhold whatever the data, such as
        a histogram whose bin edges would come from the data (see `histogram`).
        """
        if self.metadata is not None:
            validate(analysis, self.metadata)
        else:
            check_grammar(analysis)
        if isinstance(analysis, Histogram) and analysis.edges is None:
            raise AnalysisInvalid([Problem("bins", _DATA_EDGES)])
        self._analyses.append(analysis)
        return self

    def _build(self, model: type[Any], **fields: Any) -> Plan:
        try:
            analysis = model(**fields)
        except ValidationError as exc:  # models outside the analyses, e.g. a nested one
            raise AnalysisInvalid(problems_from(exc, model)) from None
        return self.add(analysis)

    # ---------------------------------------------------------------------------- analyses

    def frequency_table(
        self,
        rows: Columns,
        cols: Columns | None = None,
        *,
        where: str | None = None,
        margins: bool = False,
        round_to: int | None = None,
        suppress: bool = False,
    ) -> Plan:
        """Counts of records by the categories of `rows` (and `cols`)."""
        return self._build(
            FrequencyTable,
            rows=_names(rows),
            cols=_names(cols),
            where=where,
            margins=margins,
            mitigations=Mitigations(round_to=round_to, suppress=suppress),
        )

    def magnitude_table(
        self,
        value: str,
        rows: Columns,
        cols: Columns | None = None,
        *,
        agg: Literal["sum", "mean", "std", "mode"] = "sum",
        where: str | None = None,
        margins: bool = False,
        round_to: int | None = None,
        suppress: bool = False,
    ) -> Plan:
        """The sum, mean, standard deviation or mode (`agg`) of `value` by the categories of
        `rows` (and `cols`)."""
        return self._build(
            MagnitudeTable,
            value=value,
            agg=agg,
            rows=_names(rows),
            cols=_names(cols),
            where=where,
            margins=margins,
            mitigations=Mitigations(round_to=round_to, suppress=suppress),
        )

    def summary(
        self,
        variables: Columns,
        statistics: Sequence[SummaryStatistic] | None = None,
        *,
        quantiles: Sequence[float] = (),
        quantile_type: int = 7,
        by: Columns | None = None,
        round: int | None = None,
        where: str | None = None,
    ) -> Plan:
        """Summary statistics of `variables` (default count, mean, sd), optionally by groups."""
        fields: dict[str, Any] = {
            "variables": _names(variables),
            "quantiles": list(quantiles),
            "quantile_type": quantile_type,
            "by": _names(by),
            "round": round,
            "where": where,
        }
        if statistics is not None:
            fields["statistics"] = list(statistics)
        return self._build(Summary, **fields)

    def regression(
        self,
        formula: str,
        family: Literal["ols", "logit", "probit", "poisson"] = "ols",
        *,
        where: str | None = None,
    ) -> Plan:
        """A regression model given by a formula such as 'income ~ age + C(sex)'."""
        return self._build(Regression, formula=formula, family=family, where=where)

    def ols(self, formula: str, *, where: str | None = None) -> Plan:
        """Ordinary least squares."""
        return self.regression(formula, "ols", where=where)

    def logit(self, formula: str, *, where: str | None = None) -> Plan:
        """Logistic regression of a 0/1 response."""
        return self.regression(formula, "logit", where=where)

    def probit(self, formula: str, *, where: str | None = None) -> Plan:
        """Probit regression of a 0/1 response."""
        return self.regression(formula, "probit", where=where)

    def poisson(self, formula: str, *, where: str | None = None) -> Plan:
        """Poisson regression of a count response."""
        return self.regression(formula, "poisson", where=where)

    def correlation(
        self,
        variables: Sequence[str],
        method: Literal["pearson", "spearman"] = "pearson",
        *,
        where: str | None = None,
    ) -> Plan:
        """The correlation matrix of two or more numeric variables."""
        return self._build(Correlation, variables=list(variables), method=method, where=where)

    def histogram(
        self,
        variable: str,
        bins: int | None = None,
        *,
        edges: Sequence[float] | None = None,
        by: Columns | None = None,
        where: str | None = None,
    ) -> Plan:
        """Counts of `variable` between explicit `edges`, or in `bins` equal-width bins between
        the column's declared bounds.

        `bins` alone on a column without declared bounds is refused: the edges would be the
        data's minimum and maximum, which the output rules always withhold (and a withhold costs
        one from your withhold budget).
        """
        if bins is not None and edges is None:
            derived = self._edges_from_bounds(variable, bins)
            if derived is not None:
                edges, bins = derived, None
        return self._build(
            Histogram,
            variable=variable,
            bins=bins,
            edges=None if edges is None else list(edges),
            by=_names(by),
            where=where,
        )

    def _edges_from_bounds(self, variable: str, bins: int) -> list[float] | None:
        """`bins` + 1 equal-width edges between the declared bounds of `variable`; None when
        the plan cannot know them (`add` then reports why)."""
        if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= 1000:
            raise AnalysisInvalid([Problem("bins", "give a whole number of bins from 1 to 1000")])
        column = self.metadata.column(variable) if self.metadata is not None else None
        if column is None or column.bounds is None:
            return None
        low, high = column.bounds
        if not low < high:
            raise AnalysisInvalid(
                [Problem("bins", f"{variable!r} has no width between its declared bounds")]
            )
        # Computed from the ends each time (not by adding a step) so the last edge is `high`.
        return [low + (high - low) * i / bins for i in range(bins)] + [high]

    def chi2(self, rows: str, cols: str, *, where: str | None = None) -> Plan:
        """Chi-squared test of independence between two categorical columns."""
        return self._build(StatTest, test="chi2_independence", rows=rows, cols=cols, where=where)

    def t_test(
        self, variable: str, group: str, *, equal_var: bool = False, where: str | None = None
    ) -> Plan:
        """Two-sample t-test of `variable` between the two levels of `group` (Welch by default)."""
        return self._build(
            StatTest,
            test="t_two_sample",
            variable=variable,
            group=group,
            equal_var=equal_var,
            where=where,
        )

    def survival(
        self,
        time: str,
        event: str,
        *,
        by: Columns | None = None,
        interval: float | None = None,
        max_time: float | None = None,
        where: str | None = None,
    ) -> Plan:
        """Kaplan-Meier survival curve of `time`, with `event` 1 for an event and 0 for a
        censored record (records with any other or a missing value are left out); one curve per
        level combination of `by`.

        Every step releases its records at risk, its events and the records censored before the
        next step; each must reach the survival threshold (10 by default) or the curve is
        withheld. Pool times with `interval` (e.g. 30 for months on a time in days) and end the
        curve with `max_time` before its tail thins out.
        """
        return self._build(
            Survival,
            time=time,
            event=event,
            by=_names(by),
            interval=interval,
            max_time=max_time,
            where=where,
        )

    # ------------------------------------------------------------- differential privacy

    @staticmethod
    def _dp_fields(
        *,
        by: Columns | None,
        where: str | None,
        epsilon: float | None,
        delta: float | None,
        sigma: float | None,
        region: bool = False,
        test_against: Sequence[float] | None = None,
        null: Sequence[float] | None = None,
        alpha: float = 0.05,
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "by": _names(by),
            "where": where,
            "epsilon": epsilon,
            "delta": delta,
            "sigma": sigma,
        }
        if region and test_against is not None:
            raise AnalysisInvalid(
                [Problem("transform", "ask for a confidence region or a test, not both")]
            )
        if region:
            fields["transform"] = {"goal": "region", "alpha": alpha}
        elif test_against is not None:
            fields["transform"] = {
                "goal": "test",
                "eta": list(test_against),
                "null": None if null is None else list(null),
                "alpha": alpha,
            }
        return fields

    def dp_count(
        self,
        *,
        by: Columns | None = None,
        where: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        sigma: float | None = None,
        region: bool = False,
        test_against: Sequence[float] | None = None,
        null: Sequence[float] | None = None,
        alpha: float = 0.05,
    ) -> Plan:
        """A differentially private count of records (per declared group of `by`).

        Give `epsilon` and `delta` (sigma is calibrated) or `sigma`. `region=True` asks for the
        transformation giving the smallest confidence region of the whole answer;
        `test_against=eta` for the most powerful test of `null` (default 0) against `null + eta`.
        """
        return self._build(
            DPCount,
            **self._dp_fields(
                by=by,
                where=where,
                epsilon=epsilon,
                delta=delta,
                sigma=sigma,
                region=region,
                test_against=test_against,
                null=null,
                alpha=alpha,
            ),
        )

    def dp_sum(
        self,
        variable: str,
        *,
        by: Columns | None = None,
        where: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        sigma: float | None = None,
        region: bool = False,
        test_against: Sequence[float] | None = None,
        null: Sequence[float] | None = None,
        alpha: float = 0.05,
    ) -> Plan:
        """A differentially private sum of a bounded variable (per declared group of `by`): the
        present values clipped to its bounds, and `missing`, the records whose value is missing
        (answered at no extra budget: a record moves one of the two).

        Give `epsilon` and `delta` (sigma is calibrated) or `sigma` (each component's noise).
        `region=True` asks for the transformation giving the smallest confidence region of the
        whole answer; `test_against=eta` (one value per component, groups x components) for the
        most powerful test of `null` (default 0) against `null + eta`, at level `alpha`.
        """
        return self._build(
            DPSum,
            variable=variable,
            **self._dp_fields(
                by=by,
                where=where,
                epsilon=epsilon,
                delta=delta,
                sigma=sigma,
                region=region,
                test_against=test_against,
                null=null,
                alpha=alpha,
            ),
        )

    def dp_mean(
        self,
        variables: Columns,
        *,
        by: Columns | None = None,
        where: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        sigma: float | None = None,
        region: bool = False,
        test_against: Sequence[float] | None = None,
        null: Sequence[float] | None = None,
        alpha: float = 0.05,
    ) -> Plan:
        """Differentially private means of bounded variables per declared group of `by`.

        Per group the answer holds the sums of the values centred at their bounds' midpoints and
        the count of the records where every variable is present (a record with a missing value
        is left out and counted in `missing`); `result.frame()` / `result.dp.means()` divide,
        with a standard error that carries the noise of both the sum and the count.

        Calibrated by `epsilon` and `delta`, the noise is split for the means' error: the sums
        and the count get equal shares of the budget (the count sqrt(p) shares for p variables),
        so each component has its own sigma (`result.dp.standard_errors()`); a request whose
        mean would have a 95 % interval wider than the bounds, at the average group size, is
        refused before it is sealed. With `sigma`, every component gets that noise as asked.
        `region=True` instead shapes the noise for the smallest confidence region of the whole
        answer (Shoham & Rinott); `test_against=eta` for the most powerful test of `null`
        against `null + eta` (one value per component).
        """
        return self._build(
            DPMean,
            variables=_names(variables),
            **self._dp_fields(
                by=by,
                where=where,
                epsilon=epsilon,
                delta=delta,
                sigma=sigma,
                region=region,
                test_against=test_against,
                null=null,
                alpha=alpha,
            ),
        )

    def dp_histogram(
        self,
        variable: str,
        edges: Sequence[float],
        *,
        by: Columns | None = None,
        where: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        sigma: float | None = None,
        region: bool = False,
        test_against: Sequence[float] | None = None,
        null: Sequence[float] | None = None,
        alpha: float = 0.05,
    ) -> Plan:
        """Differentially private counts of a bounded variable between declared `edges`
        ([e_i, e_i+1), the last closed), then `missing`, the records whose value is missing;
        present values outside the edges are in no bin. `region` and `test_against` as for
        `dp_count`."""
        return self._build(
            DPHistogram,
            variable=variable,
            edges=list(edges),
            **self._dp_fields(
                by=by,
                where=where,
                epsilon=epsilon,
                delta=delta,
                sigma=sigma,
                region=region,
                test_against=test_against,
                null=null,
                alpha=alpha,
            ),
        )

    def synthetic_data(
        self,
        columns: Columns,
        *,
        epsilon: float,
        delta: float,
        method: str = "mst",
        marginals: Sequence[Sequence[str]] = (),
        bins: dict[str, Sequence[float]] | None = None,
        rows: int | None = None,
        keys: Columns | None = None,
        targets: Columns | None = None,
        where: str | None = None,
    ) -> Plan:
        """Differentially private synthetic records of `columns` (MST by default), released
        after a disclosure check against the real records (docs/synthetic.md)."""
        return self._build(
            SyntheticData,
            columns=_names(columns),
            epsilon=epsilon,
            delta=delta,
            method=method,
            marginals=[list(m) for m in marginals],
            bins={k: list(v) for k, v in (bins or {}).items()},
            rows=rows,
            keys=_names(keys),
            targets=_names(targets),
            where=where,
        )

    def dp_mean_test(
        self,
        variables: Columns,
        group: str,
        *,
        where: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        sigma: float | None = None,
        alpha: float = 0.05,
    ) -> Plan:
        """Differentially private two-sample test of equal mean vectors (DP Hotelling T^2)
        between the two declared levels of `group`."""
        return self._build(
            DPMeanTest,
            variables=_names(variables),
            group=group,
            where=where,
            epsilon=epsilon,
            delta=delta,
            sigma=sigma,
            alpha=alpha,
        )

    def train_model(
        self,
        family: Literal[
            "decision_tree", "random_forest", "gradient_boosting", "logistic_regression"
        ],
        target: str,
        features: Columns,
        *,
        params: Mapping[str, Any] | ModelParams | None = None,
        test_fraction: float = 0.3,
        seed: int = 0,
        protected: str | None = None,
        treatment: Literal[
            "none", "reweighing", "exponentiated_gradient", "threshold_optimizer"
        ] = "none",
        constraint: Literal["demographic_parity", "equalized_odds"] = "demographic_parity",
        roc: bool = False,
        where: str | None = None,
    ) -> Plan:
        """Train a classifier of `target` on `features` (docs/models.md): `params` are its
        hyper-parameters (e.g. `{"max_depth": 3, "min_samples_leaf": 50}`); `protected` names a
        protected attribute whose fairness metrics are reported, mitigated by `treatment`;
        `roc=True` also releases the ROC curve on the test split (`result.roc()`)."""
        fields: dict[str, Any] = {
            "family": family,
            "target": target,
            "features": _names(features),
            "test_fraction": test_fraction,
            "seed": seed,
            "roc": roc,
            "where": where,
        }
        if params is not None:
            fields["params"] = params if isinstance(params, ModelParams) else dict(params)
        if protected is not None:
            fields["fairness"] = {
                "protected": protected,
                "treatment": treatment,
                "constraint": constraint,
            }
        elif treatment != "none":
            raise AnalysisInvalid(
                [Problem("treatment", "a fairness treatment needs protected=COLUMN")]
            )
        return self._build(ModelTraining, **fields)

    def script(self, code: str, *, where: str | None = None) -> Plan:
        """Arbitrary Python run in the sandbox; its output always goes to human review."""
        return self._build(Script, code=code, where=where)

    # ----------------------------------------------------------------------------- checking

    def validate(self, metadata: DatasetMetadata | None = None) -> None:
        """Check every analysis against the metadata; one `AnalysisInvalid` lists all problems.

        Fields are prefixed with the analysis position, e.g. 'analyses[2].formula'.
        """
        metadata = metadata or self.metadata
        if metadata is None:
            raise ValueError("validate() needs the dataset's metadata")
        check_describes(metadata, self.dataset)
        problems: list[Problem] = []
        for i, analysis in enumerate(self._analyses):
            try:
                validate(analysis, metadata)
            except AnalysisInvalid as exc:
                problems += [Problem(f"analyses[{i}].{p.field}", p.message) for p in exc.problems]
        if problems:
            raise AnalysisInvalid(problems)

    @overload
    def rehearse(self, session: pd.DataFrame, *, show: bool = True) -> Any: ...

    @overload
    def rehearse(self, session: Any = None, *, show: bool = True) -> Rehearsal: ...

    def rehearse(self, session: Any = None, *, show: bool = True) -> Any:
        """Dry-run the plan on a mock of the dataset built from its metadata, at the centre,
        with the same compute code and output rules (nothing touches the data; nothing is
        logged or charged). Prints, per analysis, what is refused by the analysis alone and
        what the rules said on the mock, unless `show=False`; returns the report.

        A mock predicts nothing about the real verdicts: its values are drawn independently
        within the declared levels and bounds, in the published coarse shares of missing
        values, exact zeros and levels. `session` defaults to the one that made the plan.

        Given a published DP mock instead (the DataFrame of `session.mock(name)`), the plan
        runs here, with the runner's own compute code (needs `safeaccess-sandbox` installed;
        no sandbox, nothing sent): see `safeaccess.sandbox.mock.rehearsal`.
        """
        if hasattr(session, "attrs") and "safeaccess_mock" in getattr(session, "attrs", {}):
            return self._rehearse_on_mock(session, show=show)
        session = session or self.session
        if session is None:
            raise ValueError(
                "rehearse() needs a session: make the plan with session.plan(...) or pass "
                "plan.rehearse(session)"
            )
        report: Rehearsal = session.rehearse(self)
        if show:
            print(report)
        return report

    def _rehearse_on_mock(self, mock: Any, *, show: bool) -> Any:
        import importlib

        if self.metadata is None:
            raise ValueError("rehearsing on a mock needs the plan's metadata: use session.plan()")
        try:
            # optional: the client distribution does not depend on the sandbox's
            rehearsal = importlib.import_module("safeaccess.sandbox.mock.rehearsal")
        except ImportError as exc:
            raise ImportError(
                "rehearsing on a mock runs the runner's compute code here: install "
                "safeaccess-sandbox"
            ) from exc
        report = rehearsal.rehearse_on_mock(self._analyses, mock, self.metadata)
        if show:
            print(report)
        return report

    def seal(
        self,
        key: Ed25519PrivateKey,
        *,
        researcher: str,
        project: str,
        server: str,
        expires: datetime | timedelta | None = None,
        declare_kinds: bool = False,
    ) -> protocol.SealedSequence:
        """Bind the researcher to this plan: hash-chain the bodies and sign the header.

        Validates first when the plan has the metadata: a sealed mistake cannot be taken back.
        With `declare_kinds` the signed header lists the plan's analysis kinds, which a centre
        that requires a certification authority's claims for some kinds needs (docs/ca.md).
        """
        if self.metadata is not None:
            self.validate()
        return protocol.seal(
            self.bodies(),
            key,
            researcher=researcher,
            project=project,
            dataset=self.dataset,
            server=server,
            expires=expires,
            kinds=[a.kind for a in self._analyses] if declare_kinds else None,
        )


__all__ = ["Plan"]
