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


# LOO needs N > k; its ValueError for N == k is tested in test_validation.
ADVANTAGE_CASES = [
    (e, n, k) for e in obj.MaxAtKEstimator for n, k in cases() if not (e.name == "LOO" and n == k)
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


@pytest.mark.parametrize("baseline", list(obj.MeanBaseline))
def test_mean_advantages_match_oracle(baseline):
    rewards = rewards_with_ties(np.random.default_rng(7), 8, 6)
    with jax.enable_x64(True):
        got = obj.mean_advantages(rewards, baseline)
    np.testing.assert_allclose(got, ref.mean_advantages_ref(rewards, baseline), RTOL, ATOL)


@pytest.mark.parametrize(("n", "k"), [c for c in cases() if c[0] >= 2])
def test_offpolicy_matches_oracle(n, k):
    rng = np.random.default_rng(10 * n + k)
    rewards = rewards_with_ties(rng, 6, n)
    log_ratio = rng.normal(0.0, 0.3, size=(6, n))
    with jax.enable_x64(True):
        got = obj.max_at_k_offpolicy_advantages(rewards, log_ratio, k, clamp=0.25)
    want = ref.max_at_k_offpolicy_advantages_ref(rewards, log_ratio, k, clamp=0.25)
    np.testing.assert_allclose(got, want, RTOL, ATOL)


def test_offpolicy_with_zero_log_ratio_is_s():
    rewards = rewards_with_ties(np.random.default_rng(3), 4, 7)
    with jax.enable_x64(True):
        off = obj.max_at_k_offpolicy_advantages(rewards, np.zeros_like(rewards), 3, clamp=0.2)
        s = obj.max_at_k_advantages(rewards, 3, obj.MaxAtKEstimator.S)
    np.testing.assert_allclose(off, s, RTOL, ATOL)
