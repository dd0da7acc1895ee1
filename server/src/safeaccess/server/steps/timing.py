"""Reply padding: when a step is recorded, and so when anything about it can be seen, is set by
the analysis and the published metadata, not by the records (`config.timing`).

How long a step computes depends on the data: a filter's selectivity, a failure on an empty
selection, the query-set auditor's path (a carried certificate in milliseconds, a rebuild in
seconds). Everything a researcher can observe of a step changes when it is recorded: the answer
to her reveal, the step's state when she polls it, whether she may reveal the next one, her
withhold budget, the log entry of her receipt. So with `timing.pad` the flow holds each computed
step until its deadline, `base_seconds + seconds_per_million_records x rows` (the version's row
count is in the catalogue), counted from the moment its computation starts, just before
recording it. A step that takes longer is recorded at the deadline times the smallest power of
two that covers it: its time then tells at most which of a handful of doublings it fell in,
never the run time itself. (Counted from the computation, not from the reveal: a step run again
after a restart or a lost worker is padded on its own run, not on the outage before it.)
"""

from __future__ import annotations

import math
import time

from safeaccess.server.config import TimingConfig


def deadline_seconds(config: TimingConfig, rows: int) -> float:
    """The time a step on a version of `rows` records is recorded at, if it is done by then."""
    return config.base_seconds + config.seconds_per_million_records * rows / 1e6


def padded_seconds(elapsed: float, deadline: float) -> float:
    """`deadline` x 2^k for the smallest k >= 0 with that >= `elapsed`."""
    if elapsed <= deadline:
        return deadline
    return deadline * 2.0 ** math.ceil(math.log2(elapsed / deadline))


def hold_until_padded(config: TimingConfig, started: float, rows: int) -> float:
    """Sleep until the padded time of a computation that started at `started` (a
    `time.monotonic()` reading); returns the padded duration. Nothing is held without
    `config.pad`."""
    if not config.pad:
        return 0.0
    elapsed = time.monotonic() - started
    target = padded_seconds(max(elapsed, 0.0), deadline_seconds(config, rows))
    if target > elapsed:
        time.sleep(target - elapsed)
    return target
