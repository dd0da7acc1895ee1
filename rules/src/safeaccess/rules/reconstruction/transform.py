"""Intervals through a model outcome's transform (`log(income) ~ 1`), both ways.

The filters-as-bounds check (`bounds.py`) asks how tightly the released statistics fix one
record's value, against the range the filter and the declared bounds left it. A model of
`log(income)` releases statistics of the log values while the filter bounds income itself, so
the check runs in two scales:

- forward (`image`): each record's bounds on the column, carried through the transform, are the
  bounds on the values the fit summarises (each allowed transform is continuous, so the image of
  an interval is the interval between the image's least and greatest values, exact);
- back (`preimage_measure`): the range the released statistics leave on the transformed scale,
  mapped back to the column and cut to the record's bounds, is what the release tells about the
  record's *income*; its length is compared with the prior range on that same scale.

Comparing on the column's scale is what makes `log` usable: a column bounded below by 0 has an
infinite lower end on the log scale, so the log-scale prior is infinite for every ordinary
model, while the posterior's back-mapped range is the whole [0, upper] (exp of a very negative
number is 0): nothing is learnt, and the check says so. On a padded set the back-mapped range
is a few per cent of the target's income, out of a range of 200 000, and the check withholds,
as it does for a summary of the untransformed income.

Non-monotone steps (`abs`, even powers) have two-piece preimages; the measure of their union is
used, so a release that leaves a value's magnitude but not its sign is not called disclosive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from safeaccess.rules.outputs import TransformStep

Interval = tuple[float, float]


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _expm1(x: float) -> float:
    try:
        return math.expm1(x)
    except OverflowError:
        return math.inf


def _log(x: float) -> float:
    return -math.inf if x <= 0.0 else math.log(x)


def _pow(x: float, k: int) -> float:
    try:
        return float(x**k)
    except OverflowError:
        return math.copysign(math.inf, x) if k % 2 else math.inf


def _root(x: float, k: int) -> float:
    """The real k-th root, signed for odd k (x >= 0 for even k)."""
    if math.isinf(x):
        return x
    return math.copysign(abs(x) ** (1.0 / k), x)


def _abs_image(lo: float, hi: float) -> Interval:
    if lo < 0.0 < hi:
        return 0.0, max(-lo, hi)
    return min(abs(lo), abs(hi)), max(abs(lo), abs(hi))


def _image_step(step: TransformStep, lo: float, hi: float) -> Interval:
    # Ends outside a step's domain cannot be values of the records used (the design refuses
    # non-finite outcomes), so the interval is cut to the domain first.
    if step.func == "log":
        return _log(max(lo, 0.0)), _log(max(hi, 0.0))
    if step.func == "log1p":
        lo, hi = max(lo, -1.0), max(hi, -1.0)
        return (-math.inf if lo <= -1.0 else math.log1p(lo)), (
            -math.inf if hi <= -1.0 else math.log1p(hi)
        )
    if step.func == "exp":
        return _exp(lo), _exp(hi)
    if step.func == "sqrt":
        return math.sqrt(max(lo, 0.0)), math.sqrt(max(hi, 0.0))
    if step.func == "abs":
        return _abs_image(lo, hi)
    k = step.exponent or 2
    if k % 2 == 0:
        lo, hi = _abs_image(lo, hi)
    return _pow(lo, k), _pow(hi, k)


def image(steps: Sequence[TransformStep], lo: float, hi: float) -> Interval:
    """The interval the transformed value takes when the column lies in [lo, hi] (infinite
    ends for no bound)."""
    for step in steps:
        lo, hi = _image_step(step, lo, hi)
    return lo, hi


def _preimage_step(step: TransformStep, a: float, b: float) -> list[Interval]:
    """The argument values whose image under one step lies in [a, b]."""
    if step.func == "log":
        return [(_exp(a), _exp(b))]
    if step.func == "log1p":
        return [(_expm1(a), _expm1(b))]
    if b < 0.0 and step.func != "power":
        return []
    if step.func == "exp":
        return [] if b <= 0.0 else [(_log(max(a, 0.0)), _log(b))]
    if step.func == "sqrt":
        return [(max(a, 0.0) ** 2, _pow(b, 2))]
    if step.func == "abs":
        a = max(a, 0.0)
        return [(-b, -a), (a, b)]
    k = step.exponent or 2
    if k % 2:
        return [(_root(a, k), _root(b, k))]
    if b < 0.0:
        return []
    ra, rb = _root(max(a, 0.0), k), _root(b, k)
    return [(-rb, -ra), (ra, rb)]


def preimage_measure(steps: Sequence[TransformStep], post: Interval, prior: Interval) -> float:
    """The length of the set of column values in `prior` whose transform lies in `post`: what
    the release leaves of a record's value, on the column's own scale."""
    pieces: list[Interval] = [post]
    for step in reversed(steps):
        pieces = [p for a, b in pieces for p in _preimage_step(step, a, b)]
    lo, hi = prior
    cut = sorted((max(a, lo), min(b, hi)) for a, b in pieces if min(b, hi) >= max(a, lo))
    total = 0.0
    end = -math.inf
    for a, b in cut:  # the union's length: overlapping pieces counted once
        a = max(a, end)
        if b > a:
            total += b - a
        end = max(end, b)
    return total
