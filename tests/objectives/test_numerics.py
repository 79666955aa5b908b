"""float32 numerics at large N, jit == eager, vmap == loop, no NaN on edge cases."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax import objectives as obj
from kjax.objectives import binomial

E = obj.MaxAtKEstimator


def big_group(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.round(rng.uniform(0, 1, size=(2, n)), 2)  # many ties


def large_groups(n, seed=0):
    """[3, n] float32-representable rewards: a 2-decimal grid (ties), continuous values
    in [0, 1], and values near 5 with small gaps at the top (an offset the shift-invariant
    estimators must not feel). Exactly representable, so float32 and float64 runs see the
    same input and any difference is the estimator's own rounding."""
    rng = np.random.default_rng(seed)
    rows = [np.round(rng.uniform(0, 1, n), 2), rng.uniform(0, 1, n), rng.uniform(-1, 1, n) ** 3 + 5]
    return np.stack(rows).astype(np.float32).astype(np.float64)


# Measured worst float32 error, relative to each row's largest |A| (seeds 0-2): S 2.1e-7,
# L2O, LOO_MINUS_ONE and CENTERED 1.5e-7, and max@k 1.9e-7 relative. PKPO's LOO is not
# shift-invariant: it subtracts two terms of the size of S that nearly cancel, so its
# error (2.1e-7) is relative to |S|, not to its own size (up to 1.5e-4 of that).
F32_RTOL = 2e-6  # about 10x the measured error


@pytest.mark.parametrize(("n", "k"), [(2048, 1000), (4096, 1), (4096, 64), (4096, 4000)])
def test_float32_agrees_with_float64_at_large_n(n, k):
    rewards = large_groups(n)
    with jax.enable_x64(True):
        m64 = np.asarray(obj.max_at_k(rewards, k))
        a64 = {
            e: np.asarray(obj.max_at_k_advantages(rewards, k, e))
            for e in E
            if e is not E.CHEN_ANALYTIC and n >= e.min_samples(k)
        }
    r32 = jnp.asarray(rewards, jnp.float32)
    np.testing.assert_allclose(obj.max_at_k(r32, k), m64, rtol=F32_RTOL)
    s_scale = np.abs(a64[E.S]).max(-1, keepdims=True)
    for e, want in a64.items():
        got = np.asarray(obj.max_at_k_advantages(r32, k, e))
        assert got.dtype == np.float32 and np.all(np.isfinite(got)), e
        scale = s_scale if e is E.LOO else np.abs(want).max(-1, keepdims=True)
        # + tiny: an advantage below float32's normal range (1e-41 on the tied row at
        # k = 4000, where the best of 4000 draws is almost surely a 1.0) flushes to 0.
        tol = F32_RTOL * scale + np.finfo(np.float32).tiny
        assert np.all(np.abs(got - want) <= tol), (e, np.abs(got - want).max())


def test_pass_at_k_large_n_matches_product_form():
    n, c, k = 2048, 5, 1000
    correct = jnp.arange(n)[None] < c
    prod_form = 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))
    np.testing.assert_allclose(obj.pass_at_k(correct, k), [prod_form], rtol=1e-6)
    w = binomial.max_at_k_weights(n, k)
    assert np.all(w >= 0) and abs(w.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("n", [1, 2, 5])
def test_no_nan_on_edge_cases(n):
    equal = jnp.full((3, n), 0.7)
    for k in range(1, n + 1):
        for e in E:
            if n < e.min_samples(k):
                continue
            r = jnp.zeros((3, n)) if e is E.CHEN_ANALYTIC else equal
            a = obj.max_at_k_advantages(r, k, e)
            assert np.all(np.isfinite(a)), (e, k)
            # All-equal rewards carry no signal. (S has no baseline; PKPO's LOO baseline,
            # k/(N-1) * max@k of the rest, is not shift-invariant, so neither is zero.)
            if e not in (E.S, E.LOO):
                np.testing.assert_allclose(a, 0.0, atol=1e-6)


def test_jit_equals_eager_and_compiles_once():
    rewards = jnp.asarray(big_group(16, seed=3), jnp.float32)
    traces = []

    @functools.partial(jax.jit, static_argnames=("k", "estimator"))
    def adv(r, k, estimator):
        traces.append(1)
        return obj.max_at_k_advantages(r, k, estimator)

    for e in (E.S, E.LOO, E.L2O, E.LOO_MINUS_ONE, E.CENTERED):
        np.testing.assert_allclose(
            adv(rewards, 4, e), obj.max_at_k_advantages(rewards, 4, e), rtol=1e-6, atol=1e-7
        )
    n_traces = len(traces)
    adv(rewards + 1.0, 4, E.S)  # same shapes and statics: no retrace
    assert len(traces) == n_traces
    np.testing.assert_allclose(
        jax.jit(obj.max_at_k, static_argnums=1)(rewards, 4), obj.max_at_k(rewards, 4), rtol=1e-6
    )
    np.testing.assert_allclose(
        jax.jit(obj.pass_at_k, static_argnums=1)(rewards > 0.5, 4),
        obj.pass_at_k(rewards > 0.5, 4),
        rtol=1e-6,
    )


def test_vmap_over_groups_equals_loop():
    rewards = jnp.asarray(big_group(12, seed=4), jnp.float32)
    log_ratio = jnp.asarray(np.random.default_rng(5).normal(0, 0.1, rewards.shape), jnp.float32)
    fns = {
        "loo_minus_one": lambda r, lr: obj.max_at_k_advantages(r, 5, E.LOO_MINUS_ONE),
        "l2o": lambda r, lr: obj.max_at_k_advantages(r, 5, E.L2O),
        "maxrl": lambda r, lr: obj.max_at_k_mixture_advantages(r, obj.maxrl_weights(8)),
        "max_at_k": lambda r, lr: obj.max_at_k(r, 5),
    }
    for name, fn in fns.items():
        vmapped = jax.vmap(lambda r, lr, fn=fn: fn(r[None], lr[None])[0])(rewards, log_ratio)
        looped = jnp.stack([fn(rewards[b : b + 1], log_ratio[b : b + 1])[0] for b in range(2)])
        np.testing.assert_allclose(vmapped, looped, rtol=1e-6, atol=1e-7, err_msg=name)
