"""Hypothesis properties: ranges, monotonicity in k, permutation equivariance, identities."""

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kjax import objectives as obj

E = obj.MaxAtKEstimator
SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def groups(draw, max_n=8):
    """[B, N] float64 rewards from a small grid (ties are likely) and a valid k."""
    b = draw(st.integers(1, 3))
    n = draw(st.integers(2, max_n))
    values = st.sampled_from([0.0, 0.25, 0.5, 1.0, -0.5, 2.0])
    rewards = draw(hnp.arrays(np.float64, (b, n), elements=values))
    k = draw(st.integers(1, n))
    perm = draw(st.permutations(range(n)))
    return rewards, k, np.array(perm)


@SETTINGS
@given(groups())
def test_max_at_k_in_range_and_monotone_in_k(case):
    rewards, _, _ = case
    n = rewards.shape[1]
    with jax.enable_x64(True):
        m = np.stack([obj.max_at_k(rewards, k) for k in range(1, n + 1)], axis=-1)
    assert np.all(m >= rewards.min(-1, keepdims=True) - 1e-12)
    assert np.all(m <= rewards.max(-1, keepdims=True) + 1e-12)
    assert np.all(np.diff(m, axis=-1) >= -1e-12)
    np.testing.assert_allclose(m[:, 0], rewards.mean(-1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m[:, -1], rewards.max(-1), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(groups())
def test_pass_at_k_in_unit_interval_and_monotone(case):
    rewards, _, _ = case
    correct = rewards > 0.3
    n = rewards.shape[1]
    p = np.stack([obj.pass_at_k(correct, k) for k in range(1, n + 1)], axis=-1)
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(np.diff(p, axis=-1) >= -1e-6)


@SETTINGS
@given(groups())
def test_advantages_are_permutation_equivariant(case):
    rewards, k, perm = case
    with jax.enable_x64(True):
        for e in (
            e for e in E if e is not E.CHEN_ANALYTIC and rewards.shape[1] >= e.min_samples(k)
        ):
            a = obj.max_at_k_advantages(rewards, k, e)
            a_perm = obj.max_at_k_advantages(rewards[:, perm], k, e)
            np.testing.assert_allclose(a_perm, np.asarray(a)[:, perm], rtol=1e-10, atol=1e-12)


@SETTINGS
@given(groups())
def test_s_sums_to_k_max_at_k_and_loo_minus_one_nonnegative(case):
    rewards, k, _ = case
    with jax.enable_x64(True):
        s = obj.max_at_k_advantages(rewards, k, E.S)
        np.testing.assert_allclose(s.sum(-1), k * obj.max_at_k(rewards, k), rtol=1e-10, atol=1e-12)
        if k >= 2:
            assert np.all(np.asarray(obj.max_at_k_advantages(rewards, k, E.LOO_MINUS_ONE)) >= 0)
        shifted = obj.max_at_k_advantages(rewards + 3.0, k, E.LOO_MINUS_ONE)
        np.testing.assert_allclose(
            shifted, obj.max_at_k_advantages(rewards, k, E.LOO_MINUS_ONE), atol=1e-10
        )


@SETTINGS
@given(groups())
def test_l2o_is_exactly_centred_and_shift_invariant(case):
    rewards, k, _ = case
    if rewards.shape[1] <= k:
        k = rewards.shape[1] - 1  # L2O needs N > k; groups() has N >= 2
    with jax.enable_x64(True):
        a = np.asarray(obj.max_at_k_advantages(rewards, k, E.L2O))
        shifted = obj.max_at_k_advantages(rewards + 3.0, k, E.L2O)
        loo = np.asarray(obj.max_at_k_advantages(rewards, k, E.LOO))
    np.testing.assert_allclose(a.sum(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(shifted, a, atol=1e-12)
    # PKPO's LOO differs from L2O by (k/N - k/(N-1)) m_k(others): the same vector only
    # when every m_k(others) is 0.
    n = rewards.shape[1]
    with jax.enable_x64(True):
        m_rest = np.stack(
            [obj.max_at_k(np.delete(rewards, i, axis=1), k) for i in range(n)], axis=-1
        )
    np.testing.assert_allclose(loo - a, (k / n - k / (n - 1)) * m_rest, atol=1e-12)
