"""A few-valued regressor (issue 41, part 3) through the real server and client.

2 000 people; `visits` takes 9 values (0..8) and the top one is held by 6 people. A logit of
`sick` on `log1p(visits)` has two parameters on nine values: no value group's count of the sick
follows from it alone. But its design column has at most 10 distinct values, so the runner
admits the nine value groups to the auditor, which refuses the group of 6.

Since issue 41 the runner sends the column as weighted rows (the design column and its square
over the value groups, and the logit's Hessian and likelihood rows), not as the nine groups: the
auditor then sees that one unsaturated fit determines no group and releases it, while the
saturated design (one parameter per value) is refused, and fits that add up to a group's total
are refused when they do (`test_qss_combination_attacks.py`: attack 4 with children, children²,
children³, and the fit followed by sums of its lower groups).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from e2e_helpers import Centre, add_dataset

from safeaccess.client.analyses import Regression
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer

N = 2000


def survey(seed: int = 11) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    visits = rng.integers(0, 8, N)  # 0..7 for everyone ...
    visits[:6] = 8  # ... and 8 for six people
    sick = (rng.random(N) < 0.2 + 0.05 * visits).astype(np.int64)
    return pd.DataFrame(
        {"person_id": np.arange(1, N + 1, dtype=np.int64), "visits": visits, "sick": sick}
    )


DATA = survey()
_names = itertools.count(1)


def register(centre: Centre) -> str:
    name = f"visits{next(_names)}"
    meta = DatasetMetadata(
        name=name,
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="visits", type="integer", bounds=(0, 20)),
            Column(name="sick", type="integer", bounds=(0, 1)),
        ],
    )
    add_dataset(centre.root, name=name, frame=DATA, metadata=meta, project="p1")
    return name


def released(centre: Centre, url: str, name: str, analysis: Regression) -> bool:
    with connect(url, centre.keys["ada"], "ada") as session:
        step = session.run(centre.seal([analysis], dataset=name))[0]
    return step.released


@pytest.fixture(scope="module")
def dataset(centre_server: tuple[Centre, EmbeddedServer]) -> str:
    return register(centre_server[0])


def test_a_saturated_design_on_the_few_valued_regressor_is_refused(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str
) -> None:
    centre, srv = centre_server
    assert DATA["visits"].nunique() == 9 and int((DATA["visits"] == 8).sum()) == 6
    # one parameter per value: each value group's count of the sick follows
    saturated = Regression(formula="sick ~ C(visits)", family="logit")
    assert not released(centre, srv.url, dataset, saturated)


def test_a_single_logit_on_a_few_valued_regressor_is_released(
    centre_server: tuple[Centre, EmbeddedServer], dataset: str
) -> None:
    centre, srv = centre_server
    single = Regression(formula="sick ~ log1p(visits)", family="logit")
    assert released(centre, srv.url, dataset, single)
