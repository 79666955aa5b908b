"""The jitted RL step against hand-written losses on unpadded sequences, one at a time."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kjax.models import llama
from kjax.rl import losses
from kjax.rl.objective import Objective, ObjectiveConfig, compute_advantages
from kjax.rl.train_step import (
    PolicyLoss,
    StepConfig,
    completion_logprobs,
    init_train_state,
    make_train_step,
    shardings_of,
)
from tests.rl.rl_helpers import CONFIG, mesh, random_batch, tiny_params

MEAN = ObjectiveConfig()


def _run(cfg, batch, devices=2, objective=MEAN, k=1, lr=1.0, ref=False, steps=1, hook=None):
    m = mesh(devices)
    opt = optax.sgd(lr)  # params - lr * grad: the update exposes the gradient
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    step = make_train_step(CONFIG, cfg, objective, opt, m, shardings_of(state), trace_hook=hook)
    ref_params = tiny_params() if ref else None
    for _ in range(steps):
        state, metrics = step(state, batch, ref_params, k)
    return state, metrics


def _sequence_logprobs(params, batch):
    """log pi of each completion, from its own unpadded prompt + completion forward pass."""
    batch = jax.tree.map(np.asarray, batch)  # concrete: it fixes each sequence's length
    out = []
    for b in range(batch.prompts.shape[0]):
        prompt = batch.prompts[b][np.asarray(batch.prompt_mask[b])]
        row = []
        for i in range(batch.tokens.shape[1]):
            length = int(batch.mask[b, i].sum())
            completion = batch.tokens[b, i, :length]
            seq = jnp.concatenate([prompt, completion])[None]
            logits = llama.forward(params, CONFIG, seq)[0, len(prompt) - 1 : -1]
            row.append(jnp.sum(losses.token_logprobs(logits, completion)))
        out.append(jnp.stack(row))
    return jnp.stack(out)  # [B, N]


def _reference(batch):
    """Jitted (grad of the PG loss at (params, advantages), log pi(y) [B, N] at params)."""
    seq = lambda p: _sequence_logprobs(p, batch)
    loss = lambda p, adv: -jnp.mean(jnp.sum(adv * seq(p), axis=1))
    return jax.jit(jax.grad(loss)), jax.jit(seq)


def _assert_update_is(state, grads, params, lr=1.0):
    expected = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-6)


def test_completion_logprobs_match_unpadded_forward():
    params, batch = tiny_params(), random_batch()
    padded = completion_logprobs(params, CONFIG, batch.prompts, batch.prompt_mask,
                                 batch.tokens, jnp.float32)  # fmt: skip
    per_sample = jnp.sum(jnp.where(batch.mask, padded, 0.0), -1)
    expected = _reference(batch)[1](params)
    np.testing.assert_allclose(per_sample, expected, rtol=1e-5)


def test_pg_step_with_microbatches_is_the_gradient_of_the_written_loss():
    batch = random_batch(B=2)
    state, metrics = _run(StepConfig(microbatches=2), batch, devices=1)
    grads = _reference(batch)[0](tiny_params(), batch.advantages)
    _assert_update_is(state, grads, tiny_params())
    assert bool(metrics["finite"]) and int(state.step) == 1


def test_ppo_and_kl_at_the_start_equal_pg_and_sharded_equals_single_device():
    # At the first PPO update the ratio is 1 and unclipped: the PG gradient exactly. K3's
    # gradient (1 - pi_ref/pi) grad log pi is zero while the policy is the reference.
    batch = random_batch(B=8, seed=1)
    pg, _ = _run(StepConfig(), batch, devices=1)
    cfg = StepConfig(loss=PolicyLoss.PPO, kl_coef=0.5)
    ppo, metrics = _run(cfg, batch, devices=8, ref=True)
    for a, b in zip(jax.tree.leaves(pg.params), jax.tree.leaves(ppo.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    assert float(metrics["clip_fraction"]) == 0.0 and abs(float(metrics["kl"])) < 1e-6
    assert ppo.params["layers"]["q"].sharding.mesh.size == 8


def test_later_epochs_use_offpolicy_max_at_k_weights():
    # Second epoch: gradient of the PG loss with Bagirov et al.'s weights at the moved policy.
    batch = random_batch(B=2, N=2, seed=3)
    objective = ObjectiveConfig(objective=Objective.MAX_AT_K, k=2)
    cfg = StepConfig(loss=PolicyLoss.PPO, epochs=2)
    state, metrics = _run(cfg, batch, devices=1, objective=objective, k=2, lr=0.5)

    grad, seq_logprobs = _reference(batch)
    p0 = tiny_params()
    p1 = jax.tree.map(lambda p, g: p - 0.5 * g, p0, grad(p0, batch.advantages))
    log_ratio = seq_logprobs(p1) - seq_logprobs(p0)
    adv = compute_advantages(objective, 2, batch.scores, log_ratio=log_ratio)
    g1 = grad(p1, adv)
    _assert_update_is(state, g1, p1, lr=0.5)
    assert bool(metrics["finite"])


def test_no_retrace_between_steps_and_state_is_donated():
    traces = []
    m = mesh(2)
    opt = optax.adam(1e-3)
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    step = make_train_step(CONFIG, StepConfig(), MEAN, opt, m, shardings_of(state),
                           trace_hook=lambda: traces.append(1))  # fmt: skip
    for seed in range(3):
        old = state
        state, _ = step(state, random_batch(seed=seed), None, 1)
        assert old.params["embed"].is_deleted()
    assert len(traces) == 1 and int(state.step) == 3


def test_bad_microbatching_is_refused():
    with pytest.raises(ValueError, match="minibatches"):
        _run(StepConfig(microbatches=3), random_batch(B=4))
    with pytest.raises(ValueError, match="rl.epochs"):
        StepConfig(epochs=0)


@pytest.mark.gpu
def test_pg_gradient_on_the_accelerator():
    # Same identity on GPU/TPU, at full float32 matmul precision (no TF32 / bf16 passes).
    with jax.default_matmul_precision("highest"):
        test_pg_step_with_microbatches_is_the_gradient_of_the_written_loss()
        test_no_retrace_between_steps_and_state_is_donated()
