"""allocate against exhaustive search on small instances; guarantees and feasibility."""

import itertools
import math

import numpy as np
import pytest

from kjax.inference import (
    AllocationMethod,
    allocate,
    allocation_value,
    unbiased_allocation_value,
)


def exhaustive(success, costs, budget):
    """The best value over every feasible count vector."""
    caps = [int(budget // c + 1e-9) for c in costs]
    best = 0.0
    for x in itertools.product(*(range(m + 1) for m in caps)):
        if np.dot(x, costs) <= budget + 1e-9:
            best = max(best, allocation_value(success, x))
    return best


def instances(seed, count):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        P, C = rng.integers(1, 7), rng.integers(1, 4)
        # Sparse success patterns make mixing configurations pay off.
        success = rng.random((P, C)) * (rng.random((P, C)) < 0.6)
        costs = rng.choice([1.0, 1.5, 2.0, 3.0], size=C)
        yield success, costs, float(rng.integers(0, 9))


def feasible(x, costs, budget):
    return np.all(x >= 0) and x.dtype.kind == "i" and float(x @ costs) <= budget * (1 + 1e-9)


def test_exact_matches_exhaustive_search():
    for success, costs, budget in instances(0, 60):
        x = allocate(success, costs, budget, method=AllocationMethod.EXACT)
        assert feasible(x, costs, budget)
        want = exhaustive(success, costs, budget)
        assert allocation_value(success, x) == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(
    "method, bound",
    [
        (AllocationMethod.GREEDY_ENUM3, 1 - 1 / math.e),
        (AllocationMethod.GREEDY, (1 - 1 / math.e) / 2),
    ],
)
def test_greedy_guarantees_on_small_instances(method, bound):
    for success, costs, budget in instances(1, 60):
        x = allocate(success, costs, budget, method=method)
        assert feasible(x, costs, budget)
        assert allocation_value(success, x) >= bound * exhaustive(success, costs, budget) - 1e-12


def test_mixing_beats_every_single_configuration():
    # Config 0 solves only the first half of the problems, config 1 only the second half.
    success = np.array([[0.9, 0.0]] * 5 + [[0.0, 0.9]] * 5)
    x = allocate(success, np.ones(2), 4)
    np.testing.assert_array_equal(x, [2, 2])
    assert allocation_value(success, x) > allocation_value(success, [4, 0])


def test_feasible_and_fast_methods_on_large_random_instances():
    rng = np.random.default_rng(2)
    for C in (3, 12, 40):
        success = rng.random((300, C)) ** 3
        costs = rng.uniform(0.5, 3.0, size=C)
        budget = 60.0
        x = allocate(success, costs, budget)  # AUTO: greedy variants at these sizes
        assert feasible(x, costs, budget)
        single = max(
            allocation_value(success, np.eye(C, dtype=int)[c] * int(budget // costs[c]))
            for c in range(C)
        )
        assert allocation_value(success, x) >= single - 1e-12


def test_unbiased_value_equals_subset_enumeration():
    # One problem, two configurations: 5 draws (2 correct) and 4 draws (1 correct).
    draws = [[1, 1, 0, 0, 0], [1, 0, 0, 0]]
    for counts in itertools.product(range(4), range(4)):
        fail = 1.0
        for d, x in zip(draws, counts, strict=True):
            subs = list(itertools.combinations(d, x))
            fail *= np.mean([not any(s) for s in subs])
        got = unbiased_allocation_value([[2, 1]], [[5, 4]], counts)
        assert got == pytest.approx(1 - fail, rel=1e-12)
    with pytest.raises(ValueError, match="Draw more"):
        unbiased_allocation_value([[2, 1]], [[5, 4]], [6, 0])


def test_bad_inputs():
    with pytest.raises(ValueError, match="`success`"):
        allocate(np.array([[1.5]]), [1.0], 2)
    with pytest.raises(ValueError, match="`costs`"):
        allocate(np.array([[0.5]]), [0.0], 2)
    with pytest.raises(ValueError, match="`costs` must be"):
        allocate(np.array([[0.5, 0.1]]), [1.0], 2)
    with pytest.raises(ValueError, match="`budget`"):
        allocate(np.array([[0.5]]), [1.0], -1)


@pytest.mark.parametrize("method", list(AllocationMethod))
def test_the_budget_is_spent_even_without_any_success(method):
    x = allocate(np.zeros((4, 3)), np.array([1.0, 2.0, 3.0]), 7, method=method)
    assert float(x @ np.array([1.0, 2.0, 3.0])) > 7 - 1  # no sample of cost 1 still fits
