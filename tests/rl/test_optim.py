"""The optimizer: learning rates follow warmup + cosine in closed form; clipping; decay mask.

Adam's bias-corrected moments of a constant gradient g are exactly g and g^2, so the
update at step t is -lr(t) g / (|g| + eps): the learning rate is read off real updates.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kjax.rl.optim import OptimizerConfig, make_optimizer, make_schedule

PEAK, WARMUP, TOTAL, END = 1e-3, 10, 110, 0.1


def closed_form_lr(step):
    if step < WARMUP:
        return PEAK * step / WARMUP
    frac = min(step - WARMUP, TOTAL - WARMUP) / (TOTAL - WARMUP)
    end = PEAK * END
    return end + (PEAK - end) * 0.5 * (1 + math.cos(math.pi * frac))


CFG = OptimizerConfig(
    learning_rate=PEAK, warmup_steps=WARMUP, total_steps=TOTAL, end_lr_ratio=END, eps=1e-12
)


def test_schedule_matches_closed_form():
    sched = make_schedule(CFG)
    for step in (0, 1, 5, 10, 11, 35, 60, 109, 110, 500):
        np.testing.assert_allclose(sched(step), closed_form_lr(step), rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(sched(60), PEAK * (END + (1 - END) * 0.5), rtol=1e-5)


def run_steps(cfg, grads, params):
    opt = make_optimizer(cfg)
    state = opt.init(params)
    update = jax.jit(opt.update)
    out = []
    for g in grads:
        upd, state = update(g, state, params)
        out.append(upd)
    return out


def test_updates_use_the_scheduled_learning_rate_under_jit():
    params = {"w": jnp.ones((2, 3))}
    grads = [{"w": jnp.full((2, 3), 0.5)}] * 14
    updates = run_steps(CFG, grads, params)
    got = [float(u["w"][0, 0]) for u in updates]
    want = [-closed_form_lr(t) for t in range(14)]  # step 0 is the first update
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("g", [[3.0, 4.0], [0.3, 0.4]], ids=["clipped", "under_limit"])
def test_global_norm_clipping_precedes_adam(g):
    """With eps = 1 Adam is not scale-invariant, so clipping shows: -lr g'/(|g'| + 1)."""
    cfg = OptimizerConfig(learning_rate=0.1, total_steps=10, eps=1.0, max_grad_norm=1.0)
    g = np.array(g)
    (upd,) = run_steps(cfg, [{"w": jnp.asarray(g, jnp.float32)}], {"w": jnp.zeros(2)})
    clipped = g * min(1.0, 1.0 / np.linalg.norm(g))
    np.testing.assert_allclose(upd["w"], -0.1 * clipped / (np.abs(clipped) + 1.0), rtol=1e-5)
    no_clip = OptimizerConfig(learning_rate=0.1, total_steps=10, eps=1.0, max_grad_norm=None)
    (raw,) = run_steps(no_clip, [{"w": jnp.asarray(g, jnp.float32)}], {"w": jnp.zeros(2)})
    np.testing.assert_allclose(raw["w"], -0.1 * g / (np.abs(g) + 1.0), rtol=1e-5)


@pytest.mark.parametrize("decay_vectors", [False, True])
def test_weight_decay_is_decoupled_and_masked(decay_vectors):
    cfg = OptimizerConfig(
        learning_rate=0.1, total_steps=10, weight_decay=0.5, decay_vectors=decay_vectors
    )
    params = {"kernel": jnp.full((2, 2), 2.0), "scale": jnp.full((3,), 2.0)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    (upd,) = run_steps(cfg, [zeros], params)  # Adam part is 0 / (0 + eps) = 0
    np.testing.assert_allclose(upd["kernel"], -0.1 * 0.5 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(upd["scale"], -0.1 * 0.5 * 2.0 if decay_vectors else 0.0)
    assert isinstance(make_optimizer(cfg), optax.GradientTransformation)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(warmup_steps=10, total_steps=10), "total_steps"),
        (dict(end_lr_ratio=1.5), "end_lr_ratio"),
        (dict(b2=1.0), "b2"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(total_steps=10.5), "total_steps"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"config.optimizer.{field}"):
        OptimizerConfig(**kwargs)
