"""The padded time of a step (`steps/timing.py`): never before its deadline, never before the
run ended, and one of the deadline's doublings, the smallest that covers the run."""

from __future__ import annotations

import math
import time

from hypothesis import given
from hypothesis import strategies as st

from safeaccess.server.config import TimingConfig
from safeaccess.server.steps.timing import deadline_seconds, hold_until_padded, padded_seconds


@given(
    elapsed=st.floats(min_value=0, max_value=1e5, allow_nan=False),
    deadline=st.floats(min_value=1e-3, max_value=1e3, allow_nan=False),
)
def test_the_padded_time_is_the_smallest_doubling_of_the_deadline_covering_the_run(
    elapsed: float, deadline: float
) -> None:
    padded = padded_seconds(elapsed, deadline)
    assert padded >= elapsed and padded >= deadline
    k = round(math.log2(padded / deadline))
    assert math.isclose(padded, deadline * 2**k, rel_tol=1e-9)
    # The next doubling down would not cover the run (or is below the deadline).
    assert k == 0 or padded / 2 < elapsed


def test_the_deadline_grows_with_the_published_row_count() -> None:
    config = TimingConfig(pad=True, base_seconds=0.5, seconds_per_million_records=2.0)
    assert deadline_seconds(config, 0) == 0.5
    assert math.isclose(deadline_seconds(config, 2_500_000), 5.5)


def test_a_step_is_held_until_its_padded_time_and_not_without_padding() -> None:
    config = TimingConfig(pad=True, base_seconds=0.4, seconds_per_million_records=0.0)
    started = time.monotonic() - 0.1
    before = time.monotonic()
    assert hold_until_padded(config, started, 1000) == 0.4
    assert 0.25 <= time.monotonic() - before < 0.6  # a wrong target (0.8) would hold 0.7 s
    # A run past its deadline is held to the next doubling.
    late = time.monotonic() - 0.5
    before = time.monotonic()
    assert hold_until_padded(config, late, 1000) == 0.8
    assert 0.25 <= time.monotonic() - before < 0.6  # a wrong target (1.6) would hold 1.1 s
    off = TimingConfig(pad=False, base_seconds=5.0)
    before = time.monotonic()
    assert hold_until_padded(off, started, 1000) == 0.0
    assert time.monotonic() - before < 0.2  # not the 5 s deadline
