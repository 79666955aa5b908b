"""SFT losses: masked cross-entropy and the confidence-limiting DCO loss (Chen et al. 2025).

The DCO weight is checked against the plain formula F = N p (1-p)^(N-1) / (1 - (1-p)^N)
evaluated in float64 numpy, at p from 1e-6 to 1 - 1e-6, with the loss in float32.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.rl import losses as L

B, T, V = 3, 6, 5
PS = [1e-6, 1e-3, 0.1, 0.5, 0.9, 0.999, 1 - 1e-6]
NS = [1, 2, 8, 64]


# Closed-form checks run under jit (the production path); test_eager_equals_jit covers eager.


def sft_batch(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(scale=scale, size=(B, T, V)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, V, size=(B, T)), jnp.int32)
    mask = jnp.asarray(np.arange(T)[None] >= np.array([[1], [3], [5]]))  # answer tokens
    return logits, targets, mask


def logp_targets_f64(logits, targets):
    z = np.asarray(logits, np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]


def naive_f(n, p):
    return n * p * (1 - p) ** (n - 1) / (1 - (1 - p) ** n)


@pytest.mark.parametrize("aggregation", list(L.LossAggregation))
def test_cross_entropy_matches_direct(aggregation):
    logits, targets, mask = sft_batch()
    loss, metrics = jax.jit(lambda z: L.cross_entropy_loss(z, targets, mask, aggregation))(logits)
    nll = -logp_targets_f64(logits, targets) * np.asarray(mask)
    per_seq = {
        L.LossAggregation.TOKEN_SUM: nll.sum(-1),
        L.LossAggregation.SEQ_MEAN_TOKEN_MEAN: nll.sum(-1) / np.asarray(mask).sum(-1),
        L.LossAggregation.CONSTANT_NORMALIZER: nll.sum(-1) / T,
    }[aggregation]
    np.testing.assert_allclose(loss, per_seq.mean(), rtol=1e-5)
    hit = np.asarray(logits).argmax(-1) == np.asarray(targets)
    np.testing.assert_allclose(metrics["token_accuracy"], hit[np.asarray(mask)].mean())


@pytest.mark.parametrize("n", NS)
def test_dco_gradient_is_minus_f_in_float32(n):
    p64 = np.array(PS)
    s = jnp.asarray(np.log(p64), jnp.float32)
    p = np.exp(np.asarray(s, np.float64))  # the p float32 actually represents
    loss = lambda x: L.dco_loss_from_seq_logprob(x, n)
    value, grad = jax.jit(jax.vmap(jax.value_and_grad(loss)))(s)
    assert grad.dtype == jnp.float32 and np.all(np.isfinite(grad)) and np.all(np.isfinite(value))
    np.testing.assert_allclose(grad, -naive_f(n, p), rtol=2e-5, atol=1e-30)
    np.testing.assert_allclose(value, -np.log1p(-((1 - p) ** n)), rtol=2e-5, atol=1e-30)


def test_dco_custom_gradient_agrees_with_finite_differences():
    """The custom JVP must be the derivative of the primal (float64 central differences)."""

    @functools.partial(jax.jit, static_argnums=1)
    def fd_and_grad(s, n):
        h = 1e-6
        loss = lambda x: L.dco_loss_from_seq_logprob(x, n)
        return (loss(s + h) - loss(s - h)) / (2 * h), jax.vmap(jax.grad(loss))(s)

    with jax.enable_x64(True):
        for n in NS:
            fd, grad = fd_and_grad(jnp.linspace(-6.0, -0.05, 9), n)
            np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-12)


def test_dco_is_finite_at_certainty():
    s = jnp.array([0.0, 1e-7, -1e-30], jnp.float32)  # p = 1, rounding above 1, p ~ 1
    for n in (1, 4):
        loss = lambda x, n=n: L.dco_loss_from_seq_logprob(x, n)
        value, grad = jax.jit(jax.vmap(jax.value_and_grad(loss)))(s)
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(grad))
        np.testing.assert_allclose(value, 0.0, atol=1e-6)  # -log(1 - 0^N)
        np.testing.assert_allclose(grad, -1.0 if n == 1 else 0.0, atol=1e-6)


def test_dco_with_n_1_is_token_sum_cross_entropy():
    logits, targets, mask = sft_batch(seed=1)
    dco = jax.jit(jax.value_and_grad(lambda z: L.dco_loss(z, targets, mask, 1)[0]))(logits)
    ce = jax.jit(
        jax.value_and_grad(
            lambda z: L.cross_entropy_loss(z, targets, mask, L.LossAggregation.TOKEN_SUM)[0]
        )
    )(logits)
    np.testing.assert_allclose(dco[0], ce[0], rtol=1e-5)
    np.testing.assert_allclose(dco[1], ce[1], rtol=1e-5, atol=1e-7)


def test_dco_gradient_is_f_weighted_cross_entropy():
    """grad DCO = (1/B) sum_b F(N, p_b) grad CE_b, with CE_b = -log p_b (chain rule)."""
    n = 4
    logits, targets, mask = sft_batch(seed=2, scale=3.0)  # confident: F well below 1

    def seq_logprob(z):
        return jnp.sum(jnp.where(mask, L.token_logprobs(z, targets), 0.0), -1)

    seq, pullback = jax.vjp(seq_logprob, logits)
    p = np.exp(np.asarray(seq, np.float64))
    (want,) = pullback(jnp.asarray(-naive_f(n, p) / B, jnp.float32))
    (loss, metrics), got = jax.jit(
        jax.value_and_grad(lambda z: L.dco_loss(z, targets, mask, n), has_aux=True)
    )(logits)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(loss, np.mean(-np.log1p(-((1 - p) ** n))), rtol=1e-5)
    np.testing.assert_allclose(metrics["dco_weight_mean"], naive_f(n, p).mean(), rtol=1e-5)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda z, t, m: L.dco_loss(z, t, m, 0), "n"),
        (lambda z, t, m: L.dco_loss(z, t[:, :2], m, 2), "targets"),
        (lambda z, t, m: L.cross_entropy_loss(z, t, m[:, :2]), "mask"),
        (lambda z, t, m: L.cross_entropy_loss(z, t.astype(jnp.float32), m), "targets"),
    ],
)
def test_sft_errors_name_the_argument(call, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        call(*sft_batch())


def test_eager_equals_jit():
    logits, targets, mask = sft_batch(seed=3)
    for fn in (
        lambda z: L.cross_entropy_loss(z, targets, mask),
        lambda z: L.dco_loss(z, targets, mask, 16),
    ):
        eager = jax.value_and_grad(fn, has_aux=True)(logits)
        jitted = jax.jit(jax.value_and_grad(fn, has_aux=True))(logits)
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
