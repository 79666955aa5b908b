"""RL surrogates: gradients equal their closed forms, eagerly and under jit.

Expected values come from the formulas in the docstrings (written out here in numpy), or
from autodiff of an independent exact expression; nothing is pasted from a run.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.rl import losses as L

AGG = L.LossAggregation
B, N, T = 2, 3, 5
MAX_LEN = 7


# Closed-form checks run under jit (the production path); test_eager_equals_jit covers eager.


def rollout(seed=0):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.05, 3.0, (B, N, T)).astype(np.float32)
    adv = rng.normal(size=(B, N)).astype(np.float32)
    lengths = np.array([[5, 2, 0], [1, 3, 4]])  # includes an empty sequence
    mask = np.arange(T)[None, None, :] < lengths[..., None]
    return jnp.asarray(logp), jnp.asarray(adv), jnp.asarray(mask)


def token_weight(mask, aggregation):
    """d agg_t(x) / d x_t, from the LossAggregation docstring."""
    m = np.asarray(mask, np.float64)
    if aggregation is AGG.TOKEN_SUM:
        return m
    if aggregation is AGG.CONSTANT_NORMALIZER:
        return m / MAX_LEN
    return m / np.maximum(m.sum(-1, keepdims=True), 1)


@pytest.mark.parametrize("aggregation", list(AGG))
def test_aggregation_normalisations(aggregation):
    logp, _, mask = rollout()
    x = jnp.where(mask, logp, jnp.nan)  # padding garbage must not leak in
    got = jax.jit(lambda x, m: L.aggregate_tokens(x, m, aggregation, MAX_LEN))(x, mask)
    want = (token_weight(mask, aggregation) * np.asarray(logp, np.float64)).sum(-1)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("aggregation", list(AGG))
def test_policy_gradient_grad_is_closed_form(aggregation):
    logp, adv, mask = rollout()

    def loss(lp):
        return L.policy_gradient_loss(lp, adv, mask, aggregation, max_len=MAX_LEN)[0]

    value, got = jax.jit(jax.value_and_grad(loss))(logp)
    # d/d logp[b,i,t] of -(1/B) sum_{b,i} A_bi agg_t(logp) = -A_bi * weight_bit / B.
    want = -np.asarray(adv)[..., None] * token_weight(mask, aggregation) / B
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(value, np.sum(want * np.asarray(logp)), rtol=1e-5)


def test_policy_gradient_with_is_weights():
    logp, adv, mask = rollout()
    w = jnp.asarray(np.random.default_rng(1).uniform(0.2, 2.0, (B, N, T)), jnp.float32)
    got_lp, got_w = jax.jit(
        jax.grad(lambda lp, w: L.policy_gradient_loss(lp, adv, mask, is_weights=w)[0], (0, 1))
    )(logp, w)
    want = -np.asarray(adv)[..., None] * np.asarray(mask) * np.asarray(w) / B
    np.testing.assert_allclose(got_lp, want, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(got_w, 0.0)  # weights are constants


RATIOS = np.array([0.5, 0.9, 1.0, 1.1, 1.5, 4.0], np.float32)
EPS, DUAL = 0.2, 3.0


def ppo_inputs():
    old = np.full((1, 2, RATIOS.size + 1), -1.3, np.float32)
    logp = old.copy()
    logp[..., :-1] += np.log(RATIOS)
    old[..., -1] = -np.inf  # padding garbage: must not leak into value or gradient
    mask = np.ones(old.shape, bool)
    mask[..., -1] = False
    adv = np.array([[1.5, -0.7]], np.float32)
    return jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask)


def ppo_expected_grad(adv, dual):
    """-A rho / B where the chosen term depends on rho, else 0 (TOKEN_SUM, B = 1)."""
    out = np.zeros((1, 2, RATIOS.size + 1))
    for i, a in enumerate(adv[0]):
        live = RATIOS <= 1 + EPS if a > 0 else RATIOS >= 1 - EPS
        if dual is not None and a < 0:
            live &= RATIOS <= dual
        out[0, i, :-1] = np.where(live, -a * RATIOS, 0.0)
    return out


@pytest.mark.parametrize("dual", [None, DUAL], ids=["clip", "dual_clip"])
def test_ppo_gradient_zero_exactly_where_clipped(dual):
    logp, old, adv, mask = ppo_inputs()

    def loss(lp):
        return L.ppo_clip_loss(lp, old, adv, mask, epsilon=EPS, dual_clip=dual)

    (value, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(logp)
    want = ppo_expected_grad(np.asarray(adv), dual)
    np.testing.assert_allclose(grad, want, rtol=1e-5)
    assert np.all(np.asarray(grad)[want == 0] == 0.0)  # exactly zero, not small

    a = np.asarray(adv)[0][:, None]
    obj = np.minimum(RATIOS * a, np.clip(RATIOS, 1 - EPS, 1 + EPS) * a)
    if dual is not None:
        obj = np.where(a < 0, np.maximum(obj, DUAL * a), obj)
    np.testing.assert_allclose(value, -obj.sum(), rtol=1e-5)
    # A > 0 clips rho in {1.5, 4}; A < 0 clips rho = 0.5; the dual clip takes A < 0, rho = 4.
    np.testing.assert_allclose(metrics["clip_fraction"], 3 / 12, rtol=1e-6)
    np.testing.assert_allclose(metrics["dual_clip_fraction"], (dual is not None) / 12)
    kl = np.mean(RATIOS - 1 - np.log(RATIOS))
    np.testing.assert_allclose(metrics["approx_kl"], kl, rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_max"], 4.0, rtol=1e-5)


def test_ppo_equals_policy_gradient_on_policy():
    """At rho = 1 nothing is clipped and grad PPO = grad PG (Schulman et al. 2017)."""
    logp, adv, mask = rollout()
    agg = AGG.SEQ_MEAN_TOKEN_MEAN
    g_ppo = jax.jit(jax.grad(lambda lp: L.ppo_clip_loss(lp, logp, adv, mask, agg)[0]))(logp)
    g_pg = jax.grad(lambda lp: L.policy_gradient_loss(lp, adv, mask, agg)[0])(logp)
    np.testing.assert_allclose(g_ppo, g_pg, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("aggregation", list(AGG))
def test_sequence_ratio_gradient_is_closed_form(aggregation):
    """SEQUENCE: one ratio per sample rho = exp(sum_t mask (logp - old)); where unclipped
    d loss / d logp_t = -A rho s / B on every valid token (s: the aggregation's scale of a
    sequence, token_weight / L), exactly 0 where clipped, and at rho = 1 the TOKEN
    gradient of the same aggregation."""
    logp, adv, mask = rollout()
    m = np.asarray(mask)
    shift = np.random.default_rng(4).normal(scale=0.15, size=logp.shape).astype(np.float32)
    old = jnp.asarray(np.asarray(logp) - shift)
    seq = L.RatioLevel.SEQUENCE

    def loss(lp, o):
        return L.ppo_clip_loss(lp, o, adv, mask, aggregation, epsilon=EPS, max_len=MAX_LEN,
                               ratio_level=seq)  # fmt: skip

    (value, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(logp, old)
    rho = np.exp((np.where(m, shift, 0.0)).sum(-1, dtype=np.float64))  # [B, N]
    a = np.asarray(adv, np.float64)
    live = np.where(a > 0, rho <= 1 + EPS, rho >= 1 - EPS) & m.any(-1)
    lengths = np.maximum(m.sum(-1), 1)
    scale = token_weight(mask, aggregation).sum(-1) / lengths  # [B, N]
    want = np.where(live, -a * rho * scale / B, 0.0)[..., None] * m
    np.testing.assert_allclose(grad, want, rtol=2e-5, atol=1e-8)
    assert np.all(np.asarray(grad)[want == 0] == 0.0)
    obj = np.minimum(rho * a, np.clip(rho, 1 - EPS, 1 + EPS) * a)
    np.testing.assert_allclose(value, -np.sum(scale * obj) / B, rtol=2e-5)
    clipped = ~live & m.any(-1)
    np.testing.assert_allclose(metrics["clip_fraction"], clipped.sum() / m.any(-1).sum())
    assert 0 < clipped.sum() < m.any(-1).sum()  # both regimes are exercised

    on_policy = jax.grad(lambda lp: loss(lp, logp)[0])(logp)
    token = jax.grad(
        lambda lp: L.ppo_clip_loss(lp, logp, adv, mask, aggregation, max_len=MAX_LEN)[0]
    )(logp)
    np.testing.assert_allclose(on_policy, token, rtol=1e-6, atol=1e-8)


def test_sequence_truncated_importance_weights():
    old, _, mask = rollout()
    m = np.asarray(mask)
    delta = np.random.default_rng(5).normal(scale=0.6, size=old.shape).astype(np.float32)
    w, metrics = L.truncated_importance_weights(
        old, old - delta, mask, cap=2.0, ratio_level=L.RatioLevel.SEQUENCE
    )
    log_w = np.where(m, delta, 0.0).sum(-1, dtype=np.float64)
    np.testing.assert_allclose(w, np.minimum(np.exp(log_w), 2.0), rtol=1e-5)
    valid = m.any(-1)
    np.testing.assert_allclose(metrics["tis_truncated_fraction"], np.mean(log_w[valid] > np.log(2)))


def test_truncated_importance_weights():
    old, _, mask = rollout()
    delta = np.random.default_rng(2).normal(scale=1.0, size=old.shape).astype(np.float32)
    sampler = old - delta
    w, metrics = jax.jit(lambda o, s: L.truncated_importance_weights(o, s, mask, cap=2.0))(
        old, sampler
    )
    want = np.where(np.asarray(mask), np.minimum(np.exp(delta), 2.0), 1.0)
    np.testing.assert_allclose(w, want, rtol=1e-5)
    m = np.asarray(mask)
    np.testing.assert_allclose(metrics["tis_truncated_fraction"], np.mean(delta[m] > np.log(2)))
    grad = jax.grad(lambda o: L.truncated_importance_weights(o, sampler, mask)[0].sum())(old)
    np.testing.assert_array_equal(grad, 0.0)


def categorical(seed=3, v=6):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=v)), jnp.asarray(rng.normal(size=v))


@pytest.mark.parametrize("estimator", [L.KLEstimator.K1, L.KLEstimator.K3])
def test_kl_estimator_expectation_is_exact_kl(estimator):
    """sum_y pi(y) k(y) over every outcome of a categorical equals KL(pi || ref)."""
    with jax.enable_x64(True):
        theta, phi = categorical()
        logpi, logref = jax.nn.log_softmax(theta), jax.nn.log_softmax(phi)
        exact = jnp.sum(jnp.exp(logpi) * (logpi - logref))
        got = jax.jit(lambda a, b: jnp.sum(jnp.exp(a) * L.kl_estimate(a, b, estimator)))(
            logpi, logref
        )
        np.testing.assert_allclose(got, exact, rtol=1e-12)


@pytest.mark.parametrize("estimator", list(L.KLEstimator))
def test_kl_estimator_gradient_as_a_loss(estimator):
    """E_y~pi[grad k(y)]: 0 for k1, grad KL(pi || ref) for k2, grad KL(ref || pi) for k3
    (Tang & Munos 2025)."""
    with jax.enable_x64(True):
        theta, phi = categorical()
        logref = jax.nn.log_softmax(phi)
        pi = jax.lax.stop_gradient(jax.nn.softmax(theta))  # the sampling distribution

        def expected_loss(t):
            return jnp.sum(pi * L.kl_estimate(jax.nn.log_softmax(t), logref, estimator))

        def reverse_kl(t):
            return jnp.sum(jnp.exp(logref) * (logref - jax.nn.log_softmax(t)))

        def forward_kl(t):
            logpi = jax.nn.log_softmax(t)
            return jnp.sum(jnp.exp(logpi) * (logpi - logref))

        want = {
            L.KLEstimator.K1: jnp.zeros_like(theta),
            L.KLEstimator.K2: jax.grad(forward_kl)(theta),
            L.KLEstimator.K3: jax.grad(reverse_kl)(theta),
        }[estimator]
        np.testing.assert_allclose(jax.jit(jax.grad(expected_loss))(theta), want, atol=1e-12)


def test_kl_penalty_loss_aggregates_over_b_and_n():
    logp, _, mask = rollout()
    ref = logp + jnp.asarray(np.random.default_rng(4).normal(size=logp.shape), jnp.float32)
    got, metrics = jax.jit(lambda lp: L.kl_penalty_loss(lp, ref, mask))(logp)
    d = np.asarray(ref, np.float64) - np.asarray(logp, np.float64)
    k3 = np.expm1(d) - d
    want = (token_weight(mask, AGG.SEQ_MEAN_TOKEN_MEAN) * k3).sum(-1).mean()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl"], k3[np.asarray(mask)].mean(), rtol=1e-5)


def test_entropy_matches_direct_formula():
    rng = np.random.default_rng(5)
    logits = rng.normal(scale=2.0, size=(B, N, T, 7)).astype(np.float32)
    logits[0, 0, 0, 3] = -np.inf  # a masked-out vocabulary entry
    _, _, mask = rollout()

    def from_logits(z, m):
        return L.entropy_loss(L.token_entropy(z), m)

    (loss, metrics), grad = jax.jit(jax.value_and_grad(from_logits, has_aux=True))(
        jnp.asarray(logits), mask
    )
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    h = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
    np.testing.assert_allclose(L.token_entropy(jnp.asarray(logits)), h, rtol=1e-5)
    want = -(token_weight(mask, AGG.SEQ_MEAN_TOKEN_MEAN) * h).sum(-1).mean()
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy"], h[np.asarray(mask)].mean(), rtol=1e-5)
    assert np.all(np.isfinite(grad))


def test_sequence_logprob():
    logp, _, mask = rollout()
    want = np.where(np.asarray(mask), np.asarray(logp), 0).sum(-1)
    np.testing.assert_allclose(L.sequence_logprob(logp, mask), want, rtol=1e-6)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda lp, a, m: L.policy_gradient_loss(lp[0], a, m), "logprobs"),
        (lambda lp, a, m: L.policy_gradient_loss(lp, a[:, :2], m), "advantages"),
        (lambda lp, a, m: L.policy_gradient_loss(lp, a, m.astype(jnp.float32)), "mask"),
        (lambda lp, a, m: L.ppo_clip_loss(lp, lp[:, :, :2], a, m), "old_logprobs"),
        (lambda lp, a, m: L.ppo_clip_loss(lp, lp, a, m, epsilon=1.5), "epsilon"),
        (lambda lp, a, m: L.ppo_clip_loss(lp, lp, a, m, dual_clip=0.5), "dual_clip"),
        (lambda lp, a, m: L.policy_gradient_loss(lp, a, m, "token_sum"), "aggregation"),
        (
            lambda lp, a, m: L.policy_gradient_loss(lp, a, m, AGG.CONSTANT_NORMALIZER, max_len=0),
            "max_len",
        ),
        (lambda lp, a, m: L.truncated_importance_weights(lp, lp[0], m), "sampler_logprobs"),
        (lambda lp, a, m: L.kl_penalty_loss(lp, lp, m, "k3"), "estimator"),
        (lambda lp, a, m: L.policy_gradient_loss(lp, a, m, is_weights=a), "is_weights"),
        (lambda lp, a, m: L.entropy_loss(lp[0], m), "entropy"),
        (lambda lp, a, m: L.kl_penalty_loss(lp, lp, m, L.KLEstimator.K1), "K1"),
    ],
)
def test_shape_and_option_errors_name_the_argument(call, name):
    logp, adv, mask = rollout()
    with pytest.raises(ValueError, match=name):
        call(logp, adv, mask)


def test_eager_equals_jit():
    logp, adv, mask = rollout()
    old = logp + 0.3 * jnp.sin(7.0 * logp)  # ratios on both sides of the clip range
    logits = jnp.asarray(np.random.default_rng(6).normal(size=(B, N, T, 4)), jnp.float32)
    agg = AGG.CONSTANT_NORMALIZER
    cases = [  # the two with the most branches; PG and KL are elementwise maps of these
        (lambda lp: L.ppo_clip_loss(lp, old, adv, mask, agg, epsilon=0.1, dual_clip=2.0), logp),
        (lambda z: L.entropy_loss(L.token_entropy(z), mask, agg), logits),
    ]
    for fn, x in cases:
        eager = jax.value_and_grad(fn, has_aux=True)(x)
        jitted = jax.jit(jax.value_and_grad(fn, has_aux=True))(x)
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    w_eager = L.truncated_importance_weights(old, logp, mask)
    w_jit = jax.jit(L.truncated_importance_weights)(old, logp, mask)
    for a, b in zip(jax.tree.leaves(w_eager), jax.tree.leaves(w_jit), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
