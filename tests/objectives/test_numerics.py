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


@pytest.mark.parametrize(("n", "k"), [(2048, 1000), (4096, 64), (4096, 4000)])
def test_float32_agrees_with_float64_at_large_n(n, k):
    rewards = big_group(n)
    with jax.enable_x64(True):
        m64 = np.asarray(obj.max_at_k(rewards, k))
        a64 = {
            e: np.asarray(obj.max_at_k_advantages(rewards, k, e))
            for e in E
            if e.name != "CHEN_ANALYTIC"
        }
    r32 = jnp.asarray(rewards, jnp.float32)
    np.testing.assert_allclose(obj.max_at_k(r32, k), m64, rtol=1e-5)
    # LOO subtracts two terms of the size of `s` that nearly cancel: its float32 error is
    # relative to |s|, the size of the terms, not to the small difference.
    s_scale = np.abs(a64[E.S]).max()
    for e, want in a64.items():
        got = np.asarray(obj.max_at_k_advantages(r32, k, e))
        assert np.all(np.isfinite(got)), e
        scale = max(np.abs(want).max(), s_scale if e is E.LOO else 0.0)
        np.testing.assert_allclose(got, want, atol=2e-4 * scale + 1e-30, err_msg=str(e))


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
            if e is E.LOO and n == k:
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

    for e in (E.S, E.LOO, E.LOO_MINUS_ONE, E.CENTERED):
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
        "offpolicy": lambda r, lr: obj.max_at_k_offpolicy_advantages(r, lr, 5, clamp=0.2),
        "max_at_k": lambda r, lr: obj.max_at_k(r, 5),
    }
    for name, fn in fns.items():
        vmapped = jax.vmap(lambda r, lr, fn=fn: fn(r[None], lr[None])[0])(rewards, log_ratio)
        looped = jnp.stack([fn(rewards[b : b + 1], log_ratio[b : b + 1])[0] for b in range(2)])
        np.testing.assert_allclose(vmapped, looped, rtol=1e-6, atol=1e-7, err_msg=name)
