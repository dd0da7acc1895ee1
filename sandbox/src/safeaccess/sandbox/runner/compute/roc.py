"""The ROC curve of a trained binary classifier on its test split, coarsened for release.

scikit-learn's `roc_curve` (with every threshold kept) gives the cumulative true and false
positives as the threshold falls. A released point between two thresholds tells how many test
records of each class score in that band, so points are kept only where both counts have grown
by at least `step` since the last kept point (the rest of the curve joins the final point
(1, 1)). `step` is 10 or one in twenty of the smaller class, whichever is larger, so the curve
has at most about twenty steps. Thresholds are never released: each is a test record's score.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from safeaccess.rules.outputs import RocPoint, RocStep

MIN_STEP = 10
MAX_STEPS = 20


@dataclass(frozen=True)
class Roc:
    points: list[RocPoint]
    steps: list[RocStep]
    band: np.ndarray  # per test record: the step it falls in (its score band)


def roc_step(positives: int, negatives: int) -> int:
    """Records of each class every released step must add."""
    return max(MIN_STEP, math.ceil(min(positives, negatives) / MAX_STEPS))


def coarse_roc(y: np.ndarray, score: np.ndarray) -> Roc | None:
    """The coarsened ROC curve of `score` for the binary labels `y` (1 = positive class), or
    None when a class has fewer records than one step."""
    from sklearn.metrics import roc_curve

    positives, negatives = int((y == 1).sum()), int((y == 0).sum())
    step = roc_step(positives, negatives)
    if positives < step or negatives < step:
        return None
    fpr, tpr, thresholds = roc_curve(y, score, drop_intermediate=False)
    fp = np.rint(fpr * negatives).astype(np.int64)
    tp = np.rint(tpr * positives).astype(np.int64)
    kept: list[int] = [0]  # index into the roc_curve arrays; 0 is (0, 0)
    for i in range(1, len(fp)):
        if tp[i] - tp[kept[-1]] >= step and fp[i] - fp[kept[-1]] >= step:
            kept.append(i)
    end = len(fp) - 1
    if kept[-1] != end:
        if positives - tp[kept[-1]] < step or negatives - fp[kept[-1]] < step:
            kept.pop()  # the remainder joins the last step, which then grows by >= step
        kept.append(end)
    points = [RocPoint(fpr=float(fp[i] / negatives), tpr=float(tp[i] / positives)) for i in kept]
    steps = [
        RocStep(true_positives=int(tp[b] - tp[a]), false_positives=int(fp[b] - fp[a]))
        for a, b in itertools.pairwise(kept)
    ]
    # A record is in step j when its score is below kept point j's threshold and at or above
    # kept point j + 1's (roc_curve's first threshold is +inf).
    cuts = thresholds[kept[1:-1]]
    band = np.searchsorted(-cuts, -score, side="left")
    return Roc(points=points, steps=steps, band=band.astype(np.int64))
