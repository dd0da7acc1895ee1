"""Which runner failure codes the analysis decides without the records.

A failure is an answer too: "no records satisfy the filter" against a threshold withhold tells
0 from 1. Only the codes below are decided by the analysis (or the centre's own setup); every
other code, known today or added later, may depend on the records and is answered as a withhold
(see `safeaccess.server.steps.failures`, which takes the list from here, as does the offline
rehearsal in `safeaccess.sandbox.mock.offline`).
"""

from __future__ import annotations

#: Runner codes decided by the analysis (or the centre's own setup), never by the records.
DECIDABLE_RUNNER_CODES = frozenset(
    {
        "bad_analysis",  # the runner cannot parse the analysis, or a variable is listed twice
        "bad_request",  # the server sent a malformed request: the centre's problem
        "dataset_unreadable",  # the stored file cannot be read: the same for every analysis
    }
)
