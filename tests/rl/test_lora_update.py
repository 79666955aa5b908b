"""The RL update under LoRA: only the adapters move, by the step a hand-written SGD loop
over loss_fn's adapter gradients takes (PG and PPO over two epochs, on one device and
sharded); the base gets neither a gradient nor optimizer state; a checkpoint's adapters
are refused on another base."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import sharding
from kjax.models import Llama, lora
from kjax.rl import forward, loop
from kjax.rl.config import ModelConfig, PolicyLoss, StepConfig, TrainConfig, override, to_json
from kjax.rl.train_step import TrainState, init_train_state, loss_fn, make_train_step, shardings_of
from tests.rl.rl_helpers import CONFIG, mesh, random_batch, tiny_params

LR = 0.3


def _adapted(seed=0):
    """Tiny params with rank-2 adapters on every projection, B random (not 0) so that
    every adapter has a gradient."""
    params = lora.attach(tiny_params(seed), lora.LoraConfig(rank=2, alpha=4.0), jax.random.key(1))
    rng = np.random.default_rng(seed)
    layers = {
        n: jnp.asarray(0.3 * rng.normal(size=x.shape), x.dtype) if n.endswith("_lora_b") else x
        for n, x in params["layers"].items()
    }
    return {**params, "layers": layers}


def test_optimizer_state_and_gradients_cover_only_the_adapters():
    params = _adapted()
    state = init_train_state(params, optax.adamw(1e-3), jax.random.key(0), mesh(1))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)]
    moments = [p for p in paths if p.startswith(".opt_state") and "count" not in p]
    assert moments and all("_lora_" in p for p in moments), moments
    n_adapter = sum(x.size for x in jax.tree.leaves(lora.split(params)[0]))
    n_moments = sum(
        x.size
        for p, x in jax.tree_util.tree_leaves_with_path(state.opt_state)
        if "count" not in jax.tree_util.keystr(p)
    )
    assert n_moments == 2 * n_adapter  # Adam's mu and nu, nothing for the base


def _fsdp_tensor_mesh():
    return sharding.make_mesh(data=2, fsdp=2, tensor=2, devices=jax.devices()[:8])


def _laid(m):
    """_adapted()'s tree attached on the base as the sharding rules lay it out on m."""
    rules = sharding.create_sharded(lambda: Llama(CONFIG, rngs=nnx.Rngs(0)), m).params()
    base = jax.tree.map(lambda x, r: jax.device_put(x, r.sharding), tiny_params(0), rules)
    return lora.attach(base, lora.LoraConfig(rank=2, alpha=4.0), jax.random.key(1))


def test_adapters_are_laid_out_like_the_weights_they_adapt():
    """A [L,*in,r] takes W's layout of L and the inputs, B [L,r,*out] of L and the outputs;
    the rank axis and the scale are whole (weights laid out as llama.py's rules would)."""
    m = _fsdp_tensor_mesh()
    specs = {  # name: (shape, W's spec)
        "q": ((2, 8, 4, 2), P(None, "fsdp", "tensor")),
        "o": ((2, 4, 2, 8), P(None, "tensor", None, "fsdp")),
        "down": ((2, 6, 8), P("data", "tensor", "fsdp")),
    }
    layers = {
        n: jax.device_put(jnp.ones(shape), NamedSharding(m, spec))
        for n, (shape, spec) in specs.items()
    }
    targets = (lora.Projection.Q, lora.Projection.O, lora.Projection.DOWN)
    cfg = lora.LoraConfig(rank=3, alpha=3.0, targets=targets)
    out = lora.attach({"layers": layers}, cfg, jax.random.key(0))["layers"]
    want = {
        "q": (P(None, "fsdp", None), P(None, None, "tensor", None)),
        "o": (P(None, "tensor", None, None), P(None, None, "fsdp")),
        "down": (P("data", "tensor", None), P("data", None, "fsdp")),
    }
    for n, (a, b) in want.items():
        assert out[n + "_lora_a"].sharding.spec == a, n
        assert out[n + "_lora_b"].sharding.spec == b, n
    assert out["lora_scale"].sharding.spec == P()


@pytest.mark.parametrize(
    "loss,devices",
    [("PG", 1), ("PPO", 2), pytest.param("PG", "fsdp x tensor", marks=pytest.mark.slow)],
)
def test_update_moves_only_adapters_as_hand_written_sgd(loss, devices):
    cfg = StepConfig(loss=PolicyLoss[loss], epochs=1 if loss == "PG" else 2)
    params = _adapted()
    batch = random_batch(B=4, N=2, T=4, seed=3)
    trainable, frozen = lora.split(params)

    # Reference: SGD on loss_fn's gradient w.r.t. the adapters, the base held fixed.
    old = forward.completion_logprobs(
        params, CONFIG, batch.prompts, batch.prompt_mask, batch.tokens
    ).logprobs
    grad = jax.jit(
        jax.grad(
            lambda t, first: loss_fn(
                lora.join(t, frozen), batch, cfg, CONFIG, old_logprobs=old, first=first
            )[0]
        )
    )
    ref = trainable
    for u in range(cfg.epochs):
        ref = jax.tree.map(lambda p, g: p - LR * g, ref, grad(ref, u == 0))

    m = mesh(devices) if isinstance(devices, int) else _fsdp_tensor_mesh()
    own = jax.tree.map(jnp.copy, params)  # the step donates its state's arrays
    if not isinstance(devices, int):
        own = jax.tree.map(lambda x, a: jax.device_put(jnp.copy(x), a.sharding), params, _laid(m))
    state = init_train_state(own, optax.sgd(LR), jax.random.key(0), m)
    step = make_train_step(CONFIG, cfg, optax.sgd(LR), m, shardings_of(state))
    new, metrics = step(state, batch, None, jnp.int32(2))
    assert bool(metrics["finite"])
    new_trainable, new_frozen = lora.split(new.params)
    for a, b in zip(jax.tree.leaves(new_frozen), jax.tree.leaves(frozen), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the base never moves
    moved = max(
        float(jnp.abs(a - b).max())
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(trainable), strict=True)
    )
    assert moved > 1e-3
    for path, x in jax.tree_util.tree_leaves_with_path(new_trainable):
        r = dict(jax.tree_util.tree_leaves_with_path(ref))[path]
        np.testing.assert_allclose(np.asarray(x), np.asarray(r), atol=1e-6, err_msg=str(path))


def test_checkpoints_hold_adapters_and_refuse_another_base():
    initial = TrainState(_adapted(), None, jnp.int32(0), None)
    base_id = lora.fingerprint(lora.split(initial.params)[1])
    c = types.SimpleNamespace(base_id=base_id, checkpointer=types.SimpleNamespace(directory="ck"))
    saved = loop._on_disk(c, initial)
    assert saved.params == lora.split(initial.params)[0]  # the adapters alone
    back = loop._from_disk(c, saved, {"lora_base": base_id}, initial)
    assert jax.tree.structure(back.params) == jax.tree.structure(initial.params)
    other = TrainState(_adapted(seed=5), None, jnp.int32(0), None)  # another base
    c.base_id = lora.fingerprint(lora.split(other.params)[1])
    with pytest.raises(ValueError, match=f"fingerprint {base_id}.*fingerprint {c.base_id}"):
        loop._from_disk(c, saved, {"lora_base": base_id}, other)


def test_lora_config_from_the_command_line_and_experiment_json():
    cfg = override(TrainConfig(), {"model.lora.rank": "16", "model.lora.targets": "v,q,down"})
    assert cfg.model.lora == lora.LoraConfig(
        rank=16, targets=(lora.Projection.Q, lora.Projection.V, lora.Projection.DOWN)
    )
    ident = to_json(cfg)["model"]
    assert ident["lora"]["targets"] == ["q", "v", "down"]
    assert ModelConfig(**ident) == cfg.model  # what experiments.evaluate rebuilds
    assert "lora" not in to_json(TrainConfig())["model"]  # older workdirs still resume
    with pytest.raises(ValueError, match="dropout` must be 0"):
        override(TrainConfig(), {"model.lora.rank": "4", "model.lora.dropout": "0.1"})
