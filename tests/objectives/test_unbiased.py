"""Exact (un)biasedness on a softmax bandit: enumerate every outcome of N draws.

E[sum_i A_i grad log pi(y_i)] is computed exactly over all A**N outcomes and compared
with jax.grad of the closed-form objective. Nothing is sampled, so any error in an
estimator's weights shows up as a mismatch far above float64 rounding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax import objectives as obj
from tests.objectives.helpers import all_outcomes, expected_max_of_k, expected_score_gradient

E = obj.MaxAtKEstimator
THETA = np.array([0.3, -0.2, 0.1, 0.6])
VALUES = np.array([0.0, 0.4, 1.0, 0.4])  # continuous rewards with a tie between answers 1, 3
NK = [(n, k) for n in (2, 3, 4, 5) for k in range(1, n + 1)]


def grad_j(k, values=VALUES):
    if k == 0:
        return np.zeros_like(THETA)
    return jax.grad(expected_max_of_k)(jnp.asarray(THETA), values, k)


def expected(n, fn, values=VALUES, scale=1.0):
    outcomes = all_outcomes(len(THETA), n)
    adv = fn(jnp.asarray(values)[outcomes])
    return expected_score_gradient(jnp.asarray(THETA), outcomes, adv, scale)


UNBIASED = [E.S, E.LOO, E.L2O, E.LOO_MINUS_ONE]


@pytest.mark.parametrize(
    ("estimator", "n", "k"),
    [(e, n, k) for e in UNBIASED for n, k in NK if n >= e.min_samples(k)],
)
def test_unbiased_for_grad_max_at_k(estimator, n, k):
    with jax.enable_x64(True):
        got = expected(n, lambda r: obj.max_at_k_advantages(r, k, estimator))
        np.testing.assert_allclose(got, grad_j(k), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("estimator", [E.LOO, E.L2O])
def test_leave_one_out_of_k_needs_more_than_k_samples(estimator):
    # m_k(all but i) needs N - 1 >= k: at N == k there is nothing to estimate, so raise.
    with pytest.raises(ValueError, match="`k`=3 needs at least 4 samples .* N=3"):
        obj.max_at_k_advantages(jnp.zeros((1, 3)), 3, estimator)


def maxrl_objective(theta, t, answer=2):
    """MaxRL's truncated maximum likelihood, -sum_{k<=T} (1-p)^k / k, p = pi(answer)."""
    p = jax.nn.softmax(theta)[answer]
    return -sum((1.0 - p) ** k / k for k in range(1, t + 1))


@pytest.mark.parametrize(
    ("estimator", "n", "t"),
    [
        (e, n, t)
        for e in UNBIASED
        for n in (2, 3, 4, 5)
        for t in range(1, n + 1)
        if n >= e.min_samples(t)
    ],
)
def test_maxrl_mixture_is_unbiased_for_truncated_likelihood(estimator, n, t):
    correct = np.array([0.0, 0.0, 1.0, 0.0])
    weights = obj.maxrl_weights(t)
    with jax.enable_x64(True):
        got = expected(
            n,
            lambda r: obj.max_at_k_mixture_advantages(r, weights, estimator=estimator),
            correct,
        )
        want = jax.grad(maxrl_objective)(jnp.asarray(THETA), t)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        assert np.abs(want).max() > 1e-2  # the check has teeth


@pytest.mark.parametrize("estimator", UNBIASED)
def test_mixture_is_unbiased_for_weighted_sum_on_continuous_rewards(estimator):
    n, weights = 5, {1: 0.7, 2: 0.0, 3: 1.5, 4: 0.25}
    weights = {k: w for k, w in weights.items() if n >= estimator.min_samples(k)}
    with jax.enable_x64(True):
        got = expected(
            n, lambda r: obj.max_at_k_mixture_advantages(r, weights, estimator=estimator)
        )
        want = sum(w * grad_j(k) for k, w in weights.items())
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("n", "k"), [(n, k) for n, k in NK if k >= 2])
def test_centered_equals_predicted_biased_gradient(n, k):
    with jax.enable_x64(True):
        got = expected(n, lambda r: obj.max_at_k_advantages(r, k, E.CENTERED))
        want = (1 - k / n) * grad_j(k) + (k / n) * grad_j(k - 1)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        if n == k:  # Tang et al.: the centred N == k estimator targets J_{k-1}
            np.testing.assert_allclose(got, grad_j(k - 1), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("n", "k"), NK)
def test_centered_s_is_shrunk_gradient(n, k):
    def centered_s(r):
        s = obj.max_at_k_advantages(r, k, E.S)
        return s - s.mean(-1, keepdims=True)

    with jax.enable_x64(True):
        got = expected(n, centered_s)
        np.testing.assert_allclose(got, (1 - k / n) * grad_j(k), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("n", "k"), NK)
def test_pass_at_k_matches_closed_form(n, k):
    correct = np.array([0.0, 0.0, 1.0, 0.0])

    def pass_at_k_closed(theta):
        return 1.0 - (1.0 - jax.nn.softmax(theta)[2]) ** k

    with jax.enable_x64(True):
        want = jax.grad(pass_at_k_closed)(jnp.asarray(THETA))
        for estimator in (e for e in UNBIASED if n >= e.min_samples(k)):
            got = expected(n, lambda r, e=estimator: obj.max_at_k_advantages(r, k, e), correct)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_mean_baselines(n):
    with jax.enable_x64(True):
        rloo = expected(n, lambda r: obj.mean_advantages(r, obj.MeanBaseline.RLOO), scale=1 / n)
        np.testing.assert_allclose(rloo, grad_j(1), rtol=1e-9, atol=1e-12)
        # Dr.GRPO's group mean includes the sample itself: shrinks the gradient by 1 - 1/N.
        drgrpo = expected(
            n, lambda r: obj.mean_advantages(r, obj.MeanBaseline.GROUP_MEAN), scale=1 / n
        )
        np.testing.assert_allclose(drgrpo, (1 - 1 / n) * grad_j(1), rtol=1e-9, atol=1e-12)
