"""Inference on a differentially private answer, on the researcher's side.

The server releases `y = Diag(w)^(1/2) f(S) + N(0, sigma^2 I)` (w = 1 without a transformation)
with sigma, the sensitivity and the weights w. Everything here is arithmetic on those released
numbers, so it lives in the client, which must stay light: the standard library only (the
normal distribution from `statistics`, a chi-squared quantile written out below). The server's
`safeaccess.rules.dp` holds the same closed forms; the tests check that both agree.

- `estimates()`: f^_i = y_i / sqrt(w_i), unbiased, with standard error sigma / sqrt(w_i)
  (infinite where w_i = 0: a test transformation puts no weight there);
- `confidence_region(alpha)`: the ellipsoid {f : sum_i w_i (f^_i - f_i)^2 <= sigma^2 q}, q the
  chi-squared (1 - alpha) quantile with one degree of freedom per weighted component; its
  semi-axes are sigma sqrt(q / w_i);
- `test()`: for a transformation planned as a test of f = null against f = null + eta, the
  Neyman-Pearson test with statistic T = eta' W^(1/2) (y - W^(1/2) null) / (sigma |W^(1/2) eta|),
  N(0, 1) under the null, rejecting when T > z_(1-alpha); its power is
  Phi(|W^(1/2) eta| / sigma - z_(1-alpha));
- `means()` for dp_mean: c_v + S_v / n per group, with a delta-method standard error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

_STD = NormalDist()


def _lower_gamma_regularized(a: float, x: float) -> float:
    """P(a, x), the regularised lower incomplete gamma function (series / continued fraction)."""
    if x <= 0.0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return min(1.0, total * math.exp(log_front))
    # Continued fraction for Q(a, x) (modified Lentz).
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def chi2_quantile(p: float, df: int) -> float:
    """The p-quantile of the chi-squared distribution with `df` degrees of freedom."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError("chi2_quantile needs 0 < p < 1 and df >= 1")
    lo, hi = 0.0, max(1.0, float(df))
    while _lower_gamma_regularized(df / 2.0, hi / 2.0) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _lower_gamma_regularized(df / 2.0, mid / 2.0) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Region:
    """A confidence ellipsoid: `centre` (flat, group-major) and its semi-axes."""

    centre: list[float]
    semi_axes: list[float]
    level: float

    def contains(self, point: list[float]) -> bool:
        total = 0.0
        for c, a, p in zip(self.centre, self.semi_axes, point, strict=True):
            if math.isinf(a):
                continue
            total += ((p - c) / a) ** 2
        return total <= 1.0

    @property
    def log_volume_factor(self) -> float:
        """Sum of log semi-axes (the volume up to the unit ball's constant); inf if unbounded."""
        return math.fsum(math.log(a) for a in self.semi_axes)


@dataclass(frozen=True)
class TestDecision:
    statistic: float
    critical: float
    reject: bool
    power: float
    alpha: float


class DPResult:
    """A released DP answer (`output["type"] == "dp_answer"`) and the inference it supports."""

    def __init__(self, output: dict[str, Any]):
        if output.get("type") != "dp_answer":
            raise ValueError("not a differentially private answer")
        self.output = output
        self.kind: str = output["kind"]
        self.sigma: float = float(output["sigma"])
        self.sensitivity: float = float(output["sensitivity"])
        self.groups: list[list[Any]] = output["groups"]
        self.components: list[str] = output["components"]
        self.values: list[list[float]] = output["values"]
        self.weights: list[float] | None = output.get("weights")
        self.transform: dict[str, Any] | None = output.get("transform")
        self.ledger: dict[str, Any] = output["ledger"]
        self.risk: dict[str, Any] = output["risk"]

    def _repr_html_(self) -> str:
        from safeaccess.client.notebook import dp_html

        return dp_html(self)

    @property
    def flat(self) -> list[float]:
        return [v for row in self.values for v in row]

    def _weights(self) -> list[float]:
        return list(self.weights) if self.weights is not None else [1.0] * len(self.flat)

    def estimates(self) -> list[list[float]]:
        """The unbiased estimate of each component (NaN where the transformation gave no weight)."""
        k = len(self.components)
        flat = [
            y / math.sqrt(w) if w > 0 else math.nan
            for y, w in zip(self.flat, self._weights(), strict=True)
        ]
        return [flat[g * k : (g + 1) * k] for g in range(len(self.groups))]

    def standard_errors(self) -> list[list[float]]:
        """The standard error of each component's estimate: the noise it was answered with
        (`noise_sd`, per component: sigma / sqrt(w_i), or a mean test's own sigma per statistic;
        infinite where a test transformation gave no weight)."""
        k = len(self.components)
        released = self.output.get("noise_sd")
        if released is not None:
            return [[math.inf if v is None else float(v) for v in row] for row in released]
        flat = [self.sigma / math.sqrt(w) if w > 0 else math.inf for w in self._weights()]
        return [flat[g * k : (g + 1) * k] for g in range(len(self.groups))]

    def confidence_region(self, alpha: float | None = None) -> Region:
        """The (1 - alpha) confidence ellipsoid of the whole answer."""
        if alpha is None:
            alpha = float((self.transform or {}).get("alpha", 0.05))
        weights = self._weights()
        df = sum(1 for w in weights if w > 0)
        q = chi2_quantile(1.0 - alpha, df)
        return Region(
            centre=[v for row in self.estimates() for v in row],
            semi_axes=[self.sigma * math.sqrt(q / w) if w > 0 else math.inf for w in weights],
            level=1.0 - alpha,
        )

    def test(self) -> TestDecision:
        """The planned test of f = null against f = null + eta (a `test` transformation)."""
        if not self.transform or self.transform.get("goal") != "test":
            raise ValueError("this answer was not transformed for a test; ask with test_against")
        eta = [float(v) for v in self.transform["eta"]]
        null = [float(v) for v in self.transform.get("null") or [0.0] * len(eta)]
        alpha = float(self.transform.get("alpha", 0.05))
        root = [math.sqrt(w) for w in self._weights()]
        direction = [r * e for r, e in zip(root, eta, strict=True)]
        norm = math.sqrt(math.fsum(d * d for d in direction))
        centred = [y - r * n for y, r, n in zip(self.flat, root, null, strict=True)]
        statistic = math.fsum(d * c for d, c in zip(direction, centred, strict=True)) / (
            self.sigma * norm
        )
        critical = _STD.inv_cdf(1.0 - alpha)
        return TestDecision(
            statistic=statistic,
            critical=critical,
            reject=statistic > critical,
            power=_STD.cdf(norm / self.sigma - critical),
            alpha=alpha,
        )

    def means(self) -> list[dict[str, Any]]:
        """dp_mean: per group, each variable's mean c_v + S_v / n over the records where every
        variable is present, with the delta-method standard error of the ratio, which carries
        both noises: Var = sd_S^2 / n^2 + S^2 sd_n^2 / n^4 (None when the noisy count is not
        positive), the noisy count n and the noisy number of records left out for a missing
        value (`missing`; None for a mean test, which does not release it)."""
        if self.kind not in ("dp_mean", "dp_mean_test"):
            raise ValueError("means() is for dp_mean answers")
        centres = self.output.get("centres") or []
        count_at = self.components.index("count")
        missing_at = self.components.index("missing") if "missing" in self.components else None
        names = [c.removeprefix("sum(").split(" - ")[0] for c in self.components[:count_at]]
        est, se = self.estimates(), self.standard_errors()
        rows = []
        for g, labels in enumerate(self.groups):
            n, sd_n = est[g][count_at], se[g][count_at]
            for v, name in enumerate(names):
                s, sd_s = est[g][v], se[g][v]
                ok = n > 0 and math.isfinite(n) and math.isfinite(s)
                rows.append(
                    {
                        "group": labels,
                        "variable": name,
                        "mean": centres[v] + s / n if ok else None,
                        "std_error": (
                            math.sqrt(sd_s**2 / n**2 + (s**2) * sd_n**2 / n**4) if ok else None
                        ),
                        "count": n,
                        "missing": est[g][missing_at] if missing_at is not None else None,
                    }
                )
        return rows

    def describe(self) -> str:
        led = self.ledger
        lines = [
            f"{self.kind}: sigma = {self.sigma:.6g}, sensitivity = {self.sensitivity:.6g}"
            + (
                " (transformed query)"
                if self.transform is not None
                else " (noise split per component; see standard_errors())"
                if self.weights is not None
                else ""
            ),
            f"  budget ({led['scope']}): epsilon spent {led['epsilon_spent']:.4g} of "
            f"{led['epsilon_budget']:g} at delta {led['delta']:g} after {led['releases']} "
            f"release(s); remaining mu {led['mu_remaining']:.4g}",
            "  attacker on this release: TPR "
            + ", ".join(f"{t:.3f} at FPR {f}" for f, t in self.risk["tpr_at_fpr"].items())
            + f"; AUC {self.risk['auc']:.3f}",
        ]
        if self.transform and self.transform.get("goal") == "test":
            t = self.test()
            lines.append(
                f"  test: T = {t.statistic:.3f} vs {t.critical:.3f} -> "
                f"{'reject' if t.reject else 'do not reject'} the null (power {t.power:.3f})"
            )
        if self.output.get("test"):
            lines.append(f"  mean test: {self.output['test']}")
        return "\n".join(lines)


__all__ = ["DPResult", "Region", "TestDecision", "chi2_quantile"]
