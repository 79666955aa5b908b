"""Shared fixtures of the RL tests: a tiny Llama, a mesh, and a random rollout batch."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kjax import sharding
from kjax.models import Llama, LlamaConfig
from kjax.rl.train_step import RLBatch

CONFIG = LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=24, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=4)  # fmt: skip


def tiny_params(seed=0):
    # unsafe_rbg: threefry initializers are slow to compile on a small CPU.
    model = Llama(CONFIG, rngs=nnx.Rngs(params=jax.random.key(seed, impl="unsafe_rbg")))
    return model.params()


def mesh(devices: int):
    """A data mesh over the first `devices` devices (fewer on a 1-accelerator machine)."""
    devices = min(devices, jax.device_count())
    return sharding.make_mesh(data=devices, devices=jax.devices()[:devices])


def random_batch(B=4, N=2, S=5, T=4, seed=0) -> RLBatch:
    """Left-padded prompts of random lengths, completions stopped at random lengths."""
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(2, S + 1, size=B)
    prompt_mask = np.arange(S)[None, :] >= (S - prompt_len)[:, None]
    prompts = np.where(prompt_mask, rng.integers(1, CONFIG.vocab_size, (B, S)), 0)
    lengths = rng.integers(1, T + 1, size=(B, N))
    mask = np.arange(T)[None, None, :] < lengths[..., None]
    tokens = np.where(mask, rng.integers(1, CONFIG.vocab_size, (B, N, T)), 0)
    scores = rng.integers(0, 2, size=(B, N)).astype(np.float32)
    return RLBatch(
        prompts=jnp.asarray(prompts, jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        tokens=jnp.asarray(tokens, jnp.int32),
        mask=jnp.asarray(mask),
        sampler_logprobs=jnp.asarray(-rng.random((B, N, T)), jnp.float32) * mask,
        scores=jnp.asarray(scores),
        advantages=jnp.asarray(rng.normal(size=(B, N)), jnp.float32),
    )
