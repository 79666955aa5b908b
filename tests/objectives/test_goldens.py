"""Golden values quoted in docs/estimators.md (computed by hand or in closed form)."""

import jax.numpy as jnp
import numpy as np
import pytest

from kjax import objectives as obj
from kjax.objectives import binomial

G = jnp.array([[0.1, 0.5, 0.5, 0.9, 0.0, 0.7]])


def binary_group(n, c):
    return jnp.arange(n)[None, :] < c


@pytest.mark.parametrize(
    ("n", "c", "k", "want"), [(10, 3, 5, 0.916667), (200, 1, 100, 0.5), (1024, 3, 512, 0.8753666)]
)
def test_pass_at_k_goldens(n, c, k, want):
    np.testing.assert_allclose(obj.pass_at_k(binary_group(n, c), k), [want], atol=1e-6)


@pytest.mark.parametrize(("k", "want"), [(1, 0.45), (2, 0.66), (3, 0.76), (6, 0.9)])
def test_max_at_k_goldens(k, want):
    np.testing.assert_allclose(obj.max_at_k(G, k), [want], atol=1e-6)


def test_max_at_k_weights_sum_to_one_at_n2048_k1000():
    np.testing.assert_allclose(binomial.max_at_k_weights(2048, 1000).sum(), 1.0, rtol=1e-12)


@pytest.mark.parametrize(
    ("k", "want"),
    [
        (2, [0.006667, 0.06, 0.06, 0.18, 0.0, 0.113333]),
        (3, [0.0, 0.02, 0.02, 0.18, 0.0, 0.08]),
        (6, [0.0, 0.0, 0.0, 0.2, 0.0, 0.0]),
    ],
)
def test_loo_minus_one_goldens(k, want):
    got = obj.max_at_k_advantages(G, k, obj.MaxAtKEstimator.LOO_MINUS_ONE)
    np.testing.assert_allclose(got, [want], atol=1e-6)


def test_binary_s_and_loo_minus_one_goldens():
    correct = binary_group(8, 3).astype(jnp.float32)  # n=8, c=3, k=4
    s = obj.max_at_k_advantages(correct, 4, obj.MaxAtKEstimator.S)
    np.testing.assert_allclose(s[0, :3], 0.5, atol=1e-6)
    np.testing.assert_allclose(s[0, 3:], 0.442857, atol=1e-6)
    loo1 = obj.max_at_k_advantages(correct, 4, obj.MaxAtKEstimator.LOO_MINUS_ONE)
    np.testing.assert_allclose(loo1[0, :3], 0.142857, atol=1e-6)
    np.testing.assert_allclose(loo1[0, 3:], 0.0, atol=1e-7)


def test_tang_leave_one_out_at_n_equals_k():
    # N == k: only the unique argmax gets r_(k) - r_(k-1); everyone else exactly 0.
    r = jnp.array([[0.2, 0.9, 0.4, 0.1], [0.3, 0.7, 0.7, 0.0]])
    got = obj.max_at_k_advantages(r, 4, obj.MaxAtKEstimator.LOO_MINUS_ONE)
    np.testing.assert_allclose(got[0], [0.0, 0.5, 0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(got[1], [0.0, 0.0, 0.0, 0.0], atol=1e-7)  # tie at the top
