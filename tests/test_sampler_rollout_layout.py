"""The public samplers (kjax.sampling.sample, kjax.pruned_sampling.sample_pruned) read
the weights in the sampler's own layout (kjax.sampler_layout.for_rollout): TENSOR puts
them on tensor only, once, before the rollout; AUTO leaves a CPU's params as they are.
Tokens against one device's, as the trainer's TENSOR test does (tests/test_sampling.py)."""

import jax
import numpy as np
import pytest

from kjax import sampler_layout, sampling, sharding
from kjax.pruned_sampling import sample_pruned
from kjax.sampler_weights import SamplerWeights
from tests.models.hf_reference import kjax_from_hf, random_hf_model

V = 11


@pytest.fixture(scope="module")
def model():
    return kjax_from_hf(random_hf_model(seed=0))


def _prompts(B=8, S=6, seed=2):
    rng = np.random.default_rng(seed)
    mask = np.ones((B, S), bool)
    mask[1, :2] = False
    return np.where(mask, rng.integers(0, V, (B, S)), 0).astype(np.int32), mask


def _shapes(model, B=8, S=6, n=4, T=10):
    c = model.config
    return ((c.num_layers, B, S, c.num_kv_heads, c.head_dim),
            (c.num_layers, B * n, T - 1, c.num_kv_heads, c.head_dim))  # fmt: skip


def test_auto_leaves_cpu_params_and_tensor_puts_them_on_tensor_only(model):
    """On CPUs (no memory figure) AUTO is the trainer's layout: the very same arrays. TENSOR
    on fsdp 4 x tensor 2 leaves no weight sharded over fsdp, values unchanged."""
    sharded = sharding.shard(model, sharding.make_mesh(1, 4, 2)).params()
    shapes = _shapes(model)
    auto = sampler_layout.for_rollout(sharded, model.config, SamplerWeights.AUTO, shapes, 4)
    assert all(a is b for a, b in zip(jax.tree.leaves(auto), jax.tree.leaves(sharded), strict=True))
    moved = sampler_layout.for_rollout(sharded, model.config, SamplerWeights.TENSOR, shapes, 4)
    assert any("fsdp" in str(x.sharding.spec) for x in jax.tree.leaves(sharded))
    assert all("fsdp" not in str(x.sharding.spec) for x in jax.tree.leaves(moved))
    for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(sharded), strict=True):
        np.testing.assert_array_equal(a, b)
    one = model.params()  # one device: no mesh, nothing to move
    assert sampler_layout.for_rollout(one, model.config, SamplerWeights.TENSOR, shapes, 4) is one
    with pytest.raises(ValueError, match="weights must be one of SamplerWeights.AUTO"):
        sampling.rollout_params(one, model.config, "tensor", (8, 6), 4, 10, np.float32)


@pytest.mark.slow  # ~50 s under load (load 8): three samplers compiled; AUTO is TRAIN on CPUs
def test_public_samplers_in_the_tensor_layout_draw_one_devices_tokens(model):
    prompts, mask = _prompts()
    kw = dict(key=jax.random.key(5), n=4, max_new_tokens=10, top_p=0.9, stop_ids=(3,))
    single = sampling.sample(model, prompts, mask, **kw)
    mesh = sharding.make_mesh(1, 4, 2)
    rows = sharding.batch_sharding(mesh)
    args = (sharding.shard(model, mesh), jax.device_put(prompts, rows), jax.device_put(mask, rows))
    out = sampling.sample(*args, **kw, weights=SamplerWeights.TENSOR)
    for name in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(out, name), getattr(single, name))
    np.testing.assert_allclose(out.logprobs, single.logprobs, atol=1e-5)
    pk = dict(config=model.config, n=4, max_new_tokens=10, schedule=((5, 2),))
    ref = sample_pruned(model.params(), prompts, mask, jax.random.key(5), **pk)
    got = sample_pruned(args[0].params(), *args[1:], jax.random.key(5), **pk,
                        weights=SamplerWeights.TENSOR)  # fmt: skip
    np.testing.assert_array_equal(got.candidates, ref.candidates)
    np.testing.assert_array_equal(got.rollouts.tokens, ref.rollouts.tokens)
