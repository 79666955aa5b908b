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


@pytest.mark.parametrize(("n", "k"), NK)
@pytest.mark.parametrize("estimator", [E.S, E.LOO, E.LOO_MINUS_ONE])
def test_unbiased_for_grad_max_at_k(estimator, n, k):
    if estimator is E.LOO and n == k:
        return  # LOO is undefined at N == k (a ValueError, tested in test_validation)
    with jax.enable_x64(True):
        got = expected(n, lambda r: obj.max_at_k_advantages(r, k, estimator))
        np.testing.assert_allclose(got, grad_j(k), rtol=1e-9, atol=1e-12)


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
        for estimator in (E.S, E.LOO_MINUS_ONE):
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


@pytest.mark.parametrize(("n", "k"), [(3, 2), (4, 2), (4, 3)])
def test_offpolicy_error_is_second_order(n, k):
    """Samples from pi_old, gradient at theta = theta_old + eps*u: the linearised importance
    weights leave an O(eps^2) error, while ignoring the ratios leaves O(eps)."""
    u = np.array([0.5, -1.0, 0.25, 0.75])
    outcomes = all_outcomes(len(THETA), n)

    def errors(eps):
        theta = jnp.asarray(THETA + eps * u)
        r = jnp.asarray(VALUES)[outcomes]
        logp_new = jax.nn.log_softmax(theta)[outcomes]
        logp_old = jax.nn.log_softmax(jnp.asarray(THETA))[outcomes]
        adv = obj.max_at_k_offpolicy_advantages(r, logp_new - logp_old, k, clamp=10.0)
        naive = obj.max_at_k_advantages(r, k, E.S)
        # E_old[sum_i A_i grad log pi_theta(y_i)]: old-policy weights, new-policy scores.
        w_old = jnp.exp(jnp.sum(logp_old, -1))
        p = jax.nn.softmax(theta)
        onehot = jax.nn.one_hot(outcomes, len(THETA), dtype=theta.dtype)

        def est(a):
            per = jnp.einsum("mn,mna->ma", a, onehot) - a.sum(-1)[:, None] * p
            return jnp.einsum("m,ma->a", w_old, per)

        true = jax.grad(expected_max_of_k)(theta, VALUES, k)
        return np.linalg.norm(est(adv) - true), np.linalg.norm(est(naive) - true)

    with jax.enable_x64(True):
        off1, naive1 = errors(0.02)
        off2, naive2 = errors(0.01)
    assert 3.0 < off1 / off2 < 5.0, (off1, off2)  # halving eps quarters the error
    assert 1.5 < naive1 / naive2 < 2.5, (naive1, naive2)  # ignoring ratios: only halves
    assert off1 < 0.1 * naive1
