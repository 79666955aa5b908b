"""kjax.rl.train_step.loss_fn against losses written out here, and make_train_step's update
against an optimizer applied to loss_fn's gradient.

The reference log-probs come from one plain llama.forward over each completion as its own
unpadded sequence (prompt padding removed, right-padded), not from kjax.rl.forward, and
every reduction (aggregation over T, sum over N, mean over B) is spelled out here.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kjax.models import llama
from kjax.rl.step_config import (
    KLEstimator,
    LossAggregation,
    OffPolicyMaxAtK,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.rl.train_step import init_train_state, loss_fn, make_train_step, shardings_of
from tests.rl.rl_helpers import CONFIG, mesh, random_batch, tiny_params

B, N, S, T = 4, 3, 5, 4
BATCH = random_batch(B=B, N=N, S=S, T=T, seed=3)
MASK = np.asarray(BATCH.mask)
LENGTHS = MASK.sum(-1)  # [B, N], each >= 1
ADV = np.asarray(BATCH.advantages, np.float64)


def _token_logits(params, batch=BATCH):
    """Logits [B,N,T,V] predicting each completion token (meaningless past its length),
    from one forward over every completion as its own unpadded sequence."""
    np_batch = jax.tree.map(np.asarray, batch)
    Bb, Nb, Tb = np_batch.tokens.shape
    L = np_batch.prompts.shape[1] + Tb
    ids, real = np.zeros((Bb * Nb, L), np.int32), np.zeros((Bb * Nb, L), bool)
    index = np.zeros((Bb, Nb, Tb), np.int32)
    for b in range(Bb):
        prompt = np_batch.prompts[b][np_batch.prompt_mask[b]]
        for i in range(Nb):
            seq = np.concatenate([prompt, np_batch.tokens[b, i][np_batch.mask[b, i]]])
            ids[b * Nb + i, : len(seq)], real[b * Nb + i, : len(seq)] = seq, True
            index[b, i] = np.minimum(len(prompt) - 1 + np.arange(Tb), L - 1)
    logits = llama.forward(params, CONFIG, jnp.asarray(ids), attention_mask=jnp.asarray(real))
    logits = logits.reshape(Bb, Nb, L, -1)
    return jnp.take_along_axis(logits, jnp.asarray(index)[..., None], axis=2)


def _log_softmax(params, temperature=1.0):
    return jax.nn.log_softmax(_token_logits(params) / temperature, axis=-1)


def _token_logprobs(params, temperature=1.0):
    """log pi [B,N,T] of each sampled token under softmax(logits / temperature), 0 past
    the completion's length."""
    logp = _log_softmax(params, temperature)
    lp = jnp.take_along_axis(logp, BATCH.tokens[..., None], axis=-1)[..., 0]
    return jnp.where(MASK, lp, 0.0)


def _per_sequence(x, aggregation):
    """Masked x [B,N,T] -> [B,N], written out per aggregation."""
    total = jnp.sum(jnp.where(MASK, x, 0.0), axis=-1)
    if aggregation is LossAggregation.TOKEN_SUM:
        return total
    if aggregation is LossAggregation.CONSTANT_NORMALIZER:
        return total / T
    return total / LENGTHS  # SEQ_MEAN_TOKEN_MEAN


def _pg_reference(params, aggregation, temperature=1.0, adv=ADV):
    """-(1/B) sum_b sum_i A_bi agg_t log pi(y_bit)."""
    lp = _token_logprobs(params, temperature)
    return -jnp.sum(jnp.asarray(adv, jnp.float32) * _per_sequence(lp, aggregation)) / B


def _assert_trees_close(got, want, rtol=5e-5, atol=5e-6):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@functools.cache
def _jitted_loss():
    return jax.jit(
        jax.value_and_grad(loss_fn, has_aux=True),
        static_argnames=("cfg", "model_config", "reweight", "temperature"),
    )


@pytest.mark.parametrize(
    ("aggregation", "temperature"),
    [
        (LossAggregation.TOKEN_SUM, 1.0),
        (LossAggregation.CONSTANT_NORMALIZER, 0.7),
        (LossAggregation.SEQ_MEAN_TOKEN_MEAN, 1.0),
    ],
    ids=lambda x: getattr(x, "name", str(x)),
)
def test_pg_loss_and_gradient_are_the_written_surrogate(aggregation, temperature):
    params = tiny_params()
    cfg = StepConfig(aggregation=aggregation)
    (loss, metrics), grads = _jitted_loss()(params, BATCH, cfg, CONFIG, temperature=temperature)
    want, want_grads = jax.jit(jax.value_and_grad(_pg_reference), static_argnums=(1, 2))(
        params, aggregation, temperature
    )
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["loss"]), float(want), rtol=1e-5, atol=1e-6)
    assert abs(float(want)) > 1e-3  # a non-trivial value, not 0 == 0
    _assert_trees_close(grads, want_grads)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads)) > 1e-3


def test_kl_and_entropy_terms_are_the_written_penalties():
    params, ref_params = tiny_params(), tiny_params(seed=1)
    agg = LossAggregation.SEQ_MEAN_TOKEN_MEAN
    cfg = StepConfig(aggregation=agg, kl_coef=0.5, kl_estimator=KLEstimator.K3, entropy_coef=0.1)
    ref_lp = jax.jit(_token_logprobs)(ref_params)

    def reference(p):
        logp_all = _log_softmax(p)
        lp = jnp.take_along_axis(logp_all, BATCH.tokens[..., None], axis=-1)[..., 0]
        log_r = ref_lp - lp  # K3 = r - 1 - log r per token
        kl = jnp.exp(log_r) - 1 - log_r
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        pg = -jnp.sum(jnp.asarray(ADV, jnp.float32) * _per_sequence(lp, agg)) / B
        kl_term = jnp.sum(_per_sequence(kl, agg)) / (B * N)
        entropy_term = -jnp.sum(_per_sequence(entropy, agg)) / (B * N)
        return pg + 0.5 * kl_term + 0.1 * entropy_term

    (loss, metrics), grads = _jitted_loss()(params, BATCH, cfg, CONFIG, ref_logprobs=ref_lp)
    want, want_grads = jax.jit(jax.value_and_grad(reference))(params)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5, atol=1e-6)
    _assert_trees_close(grads, want_grads)
    assert float(metrics["kl"]) > 0 and float(metrics["entropy"]) > 0
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_fn(params, BATCH, cfg, CONFIG)


def test_later_updates_use_the_reweighted_advantages():
    # PPO at its starting policy (ratio 1, unclipped) with the sequence ratio: the gradient
    # is the PG gradient of whichever advantages the update uses; the value is
    # -(1/B) sum_{b,i} A_bi * 1.
    params = tiny_params()
    cfg = StepConfig(
        loss=PolicyLoss.PPO,
        epochs=2,
        ratio_level=RatioLevel.SEQUENCE,
        offpolicy_max_at_k=OffPolicyMaxAtK.EXACT,
    )
    old = jax.jit(_token_logprobs)(params)

    def reweight(scores, log_ratio, k):  # any function of (scores, log_ratio, k) will do
        return scores * k + log_ratio

    fn = jax.jit(
        jax.value_and_grad(functools.partial(loss_fn, reweight=reweight), has_aux=True),
        static_argnames=("cfg", "model_config"),
    )
    pg_grad = jax.jit(jax.grad(_pg_reference), static_argnums=(1,))
    reweighted = np.asarray(BATCH.scores, np.float64) * 3
    for first, adv in [(True, ADV), (False, reweighted)]:
        (loss, _), grads = fn(
            params, BATCH, cfg, CONFIG, old_logprobs=old, k=jnp.int32(3), first=jnp.bool_(first)
        )
        np.testing.assert_allclose(float(loss), -adv.sum() / B, rtol=1e-5, atol=1e-5)
        _assert_trees_close(grads, pg_grad(params, LossAggregation.TOKEN_SUM, adv=adv))


LR = 0.5


@pytest.mark.parametrize(
    ("microbatches", "devices", "clip"),
    [(1, 2, None), (2, 1, 0.05)],
    ids=["sgd-1micro-2dev", "clip_sgd-2micro-1dev"],
)
def test_one_update_is_the_optimizer_applied_to_grad_loss_fn(microbatches, devices, clip):
    cfg = StepConfig(microbatches=microbatches, aggregation=LossAggregation.CONSTANT_NORMALIZER)
    opt = optax.sgd(LR)
    if clip is not None:  # an optimizer that is not a plain scaling of the gradient
        opt = optax.chain(optax.clip_by_global_norm(clip), opt)
    m = mesh(devices)
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    step = make_train_step(CONFIG, cfg, opt, m, shardings_of(state))
    new, metrics = step(state, BATCH, None, np.int32(2))

    params = tiny_params()
    (loss, _), grads = _jitted_loss()(params, BATCH, cfg, CONFIG)
    updates, _ = opt.update(grads, opt.init(params), params)
    want = optax.apply_updates(params, updates)
    _assert_trees_close(new.params, want)
    norm = float(optax.tree.norm(grads))
    if clip is not None:
        assert norm > 2 * clip  # the clip is active
    # one update: the step's loss is loss_fn's (mean over microbatches of equal size)
    np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-4)
    assert int(new.step) == 1 and bool(metrics["finite"])
