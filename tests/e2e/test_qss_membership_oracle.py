"""Issue 41, section 2: refusals that were still an oracle, through the real server and client.

1. *A membership oracle whose "no" branch is free.* One-step probes
   `C or (age >= 96 and income in (...100 values))` after `C` is released, or
   `not (age >= 96 and income in (...))` on a fresh scope (whose population is admitted first):
   when the target's income is not in the list, the probe holds exactly the released records.
   An exact value of a continuous column used to get no point on the auditor's domain grid, so
   that "no" branch counted as a structural repeat and was released, while the "yes" branch (one
   person more or less) was refused: each probe said whether the income is in the list.
2. *The `atoms` mode's refusal oracle.* The same one-step probes on `income > X` in a dataset
   audited in `atoms` mode: the "yes" branch makes an atom of one (refused), the "no" branch
   splits nothing (released), so a binary search recovers the income.

Each runs `unguarded` (admission replaced by "admit everything": the released counts give the
answer, which proves the search works) and `guarded` (as deployed: the search must not find the
value). Before the fixes the guarded runs found it too.
"""

from __future__ import annotations

import itertools

from e2e_helpers import Centre, add_dataset
from test_qss_combination_attacks import (
    OLD,
    OLDEST,
    close,
    count_of,
    metadata,
    probe,
    register,
    run,
)

from safeaccess.client.analyses import Summary
from safeaccess.server.config import QssSettings
from safeaccess.server.http.embedded import EmbeddedServer

BASE = "age < 90"
# The attacker's prior: the oldest person's income is a whole number of cents within two euros
# (a published pay scale, a rounded figure released elsewhere): 200 candidates, two lists of 100
# (a wider prior only takes more probes of the same kind).
CANDIDATES = [round(81_234.00 + cents / 100, 2) for cents in range(200)]


def in_list(values: list[float]) -> str:
    return "income in (" + ", ".join(f"{v:.2f}" for v in values) + ")"


def membership_probe(values: list[float], *, fresh: bool) -> Summary:
    target = f"age >= 96 and {in_list(values)}"
    where = f"not ({target})" if fresh else f"{BASE} or ({target})"
    return Summary(variables=["income"], statistics=["count", "mean"], where=where)


def membership_search(centre: Centre, url: str, name: str) -> float:
    """Find the income among CANDIDATES with one-step probes of at most 100 values each, after
    `age < 90` is released in the scope.

    A probe "holds" the target when its income is in the list. Unguarded, the released count
    says so (one more than `age < 90`'s); guarded, a refusal said so, since the other branch was
    released as a repeat."""
    first = run(
        centre, url, name, [Summary(variables=["income"], statistics=["count"], where=BASE)]
    )[0]
    without = count_of(first)
    assert without is not None

    def holds(values: list[float]) -> bool:
        output = run(centre, url, name, [membership_probe(values, fresh=False)])[0]
        return output is None or count_of(output) == without + 1

    pool = CANDIDATES[:100] if holds(CANDIDATES[:100]) else CANDIDATES[100:]
    while len(pool) > 1:
        half = pool[: len(pool) // 2]
        pool = half if holds(half) else pool[len(pool) // 2 :]
    return pool[0]


def test_membership_oracle_on_exact_values(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    centre, srv = centre_server
    name = register(centre, OLD)
    found = membership_search(centre, srv.url, name)
    assert close(found, OLDEST) == (guard == "unguarded")


def test_both_branches_are_refused_alike_on_a_fresh_scope(
    centre_server: tuple[Centre, EmbeddedServer],
) -> None:
    # `not (age >= 96 and income in (...))` with nothing released but the population: the list
    # without the target ("no": everyone, a repeat only the records imply) and the list with it
    # ("yes": everyone but one) are both refused, so the probe tells nothing (before the fix the
    # "no" branch was released and the same search found the income in 8 probes)
    centre, srv = centre_server
    name = register(centre, OLD)
    without = [v for v in CANDIDATES if not close(v, OLDEST)][:100]
    with_target = [OLDEST, *without[:99]]
    for values in (without, with_target):
        assert run(centre, srv.url, name, [membership_probe(values, fresh=True)])[0] is None


_atoms_names = itertools.count(1)


def register_atoms(centre: Centre) -> str:
    """OLD as a fresh dataset audited in `atoms` mode (project scope)."""
    dataset = f"atoms{next(_atoms_names)}"
    add_dataset(
        centre.root,
        name=dataset,
        frame=OLD,
        metadata=metadata(dataset),
        project="p1",
        qss=QssSettings(mode="atoms", scope="project"),
    )
    return dataset


def test_atoms_mode_refusal_oracle(
    centre_server: tuple[Centre, EmbeddedServer], guard: str
) -> None:
    # after `age < 90` is released, a binary search over cents with one-step probes
    # `age < 90 or (age >= 96 and income > X)`; refused meant "above X" in atoms mode (the
    # attacker's prior as above: within 1.28 euros, 7 probes)
    centre, srv = centre_server
    name = register_atoms(centre)
    first = run(
        centre, srv.url, name, [Summary(variables=["income"], statistics=["count"], where=BASE)]
    )[0]
    assert first is not None
    with_target = count_of(first) + 1  # type: ignore[operator]
    low, high = 8_123_400, 8_123_528  # cents: the income is in (low, high]
    while high - low > 1:
        mid = (low + high) // 2
        output = run(centre, srv.url, name, [probe(mid / 100 + 0.005)])[0]
        above = output is None or count_of(output) == with_target
        low, high = (mid, high) if above else (low, mid)
    assert close(high / 100, OLDEST) == (guard == "unguarded")
