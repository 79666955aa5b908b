"""Every fast estimator equals its subset-enumeration oracle (float64), ties included."""

import jax
import numpy as np
import pytest

from kjax import objectives as obj
from kjax.objectives import reference as ref
from tests.objectives.helpers import rewards_with_ties

RTOL, ATOL = 1e-9, 1e-12


def cases():
    for n in range(1, 9):
        for k in range(1, n + 1):
            yield n, k


@pytest.mark.parametrize(("n", "k"), list(cases()))
def test_metrics_match_oracle(n, k):
    rng = np.random.default_rng(100 * n + k)
    rewards = rewards_with_ties(rng, 6, n)
    correct = rng.random((6, n)) < 0.4
    with jax.enable_x64(True):
        np.testing.assert_allclose(
            obj.max_at_k(rewards, k), ref.max_at_k_ref(rewards, k), RTOL, ATOL
        )
        np.testing.assert_allclose(
            obj.pass_at_k(correct, k), ref.pass_at_k_ref(correct, k), RTOL, ATOL
        )


# LOO and L2O need N > k; their ValueError for N == k is tested in test_validation.
ADVANTAGE_CASES = [
    (e, n, k) for e in obj.MaxAtKEstimator for n, k in cases() if n >= e.min_samples(k)
]


@pytest.mark.parametrize(("estimator", "n", "k"), ADVANTAGE_CASES)
def test_max_at_k_advantages_match_oracle(estimator, n, k):
    rng = np.random.default_rng(1000 * n + 10 * k + list(obj.MaxAtKEstimator).index(estimator))
    if estimator is obj.MaxAtKEstimator.CHEN_ANALYTIC:
        rewards = (rng.random((8, n)) < 0.5).astype(np.float64)
    else:
        rewards = rewards_with_ties(rng, 8, n)
    with jax.enable_x64(True):
        got = obj.max_at_k_advantages(rewards, k, estimator)
    np.testing.assert_allclose(got, ref.max_at_k_advantages_ref(rewards, k, estimator), RTOL, ATOL)


MIXED = [e for e in obj.MaxAtKEstimator if e is not obj.MaxAtKEstimator.CHEN_ANALYTIC]


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("estimator", MIXED)
def test_mixture_matches_oracle(estimator, n):
    """sum_k w_k A^(k) over a random set of valid k (every k once across the seeds)."""
    rng = np.random.default_rng(100 * n + MIXED.index(estimator))
    valid = [k for k in range(1, n + 1) if n >= estimator.min_samples(k)]
    ks = rng.choice(valid, size=min(3, len(valid)), replace=False)
    weights = {int(k): float(w) for k, w in zip(ks, rng.uniform(0.0, 2.0, len(ks)), strict=True)}
    rewards = rewards_with_ties(rng, 6, n)
    with jax.enable_x64(True):
        got = obj.max_at_k_mixture_advantages(rewards, weights, estimator=estimator)
    want = ref.max_at_k_mixture_advantages_ref(rewards, weights, estimator)
    np.testing.assert_allclose(got, want, RTOL, ATOL)
    with jax.enable_x64(True):  # every k of MaxRL with the largest valid T
        got = obj.max_at_k_mixture_advantages(
            rewards, obj.maxrl_weights(valid[-1]), estimator=estimator
        )
    want = ref.max_at_k_mixture_advantages_ref(rewards, obj.maxrl_weights(valid[-1]), estimator)
    np.testing.assert_allclose(got, want, RTOL, ATOL)


@pytest.mark.parametrize("baseline", list(obj.MeanBaseline))
def test_mean_advantages_match_oracle(baseline):
    rewards = rewards_with_ties(np.random.default_rng(7), 8, 6)
    with jax.enable_x64(True):
        got = obj.mean_advantages(rewards, baseline)
    np.testing.assert_allclose(got, ref.mean_advantages_ref(rewards, baseline), RTOL, ATOL)
