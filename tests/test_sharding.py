"""Sharded Llama on 8 fake CPU devices: same logits as one device, expected specs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import sharding
from kjax.models import Llama, LlamaConfig, from_params

CONFIG = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
)
# The rules table applied by hand: vocab/mlp/heads/kv_heads -> tensor, embed -> fsdp.
EXPECTED_SPECS = {
    "embed": P("tensor", "fsdp"),
    "lm_head": P("fsdp", "tensor"),
    "final_norm": P(None),
    "layers": {
        "attn_norm": P(None, None),
        "mlp_norm": P(None, None),
        "q": P(None, "fsdp", "tensor", None),
        "k": P(None, "fsdp", "tensor", None),
        "v": P(None, "fsdp", "tensor", None),
        "o": P(None, "tensor", None, "fsdp"),
        "gate": P(None, "fsdp", "tensor"),
        "up": P(None, "fsdp", "tensor"),
        "down": P(None, "tensor", "fsdp"),
    },
}


def _make(config=CONFIG):
    # unsafe_rbg: threefry's initializers take ~1 s each to compile on a small CPU.
    return lambda: Llama(config, rngs=nnx.Rngs(params=jax.random.key(0, impl="unsafe_rbg")))


def test_make_mesh_sizes_and_errors():
    assert dict(sharding.make_mesh().shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert dict(sharding.make_mesh(data=2, fsdp=-1, tensor=2).shape)["fsdp"] == 2
    with pytest.raises(ValueError, match="needs 12 devices"):
        sharding.make_mesh(data=3, fsdp=2, tensor=2)
    with pytest.raises(ValueError, match="at most one"):
        sharding.make_mesh(data=-1, fsdp=-1)


def test_indivisible_dimension_is_replicated():
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    spec = sharding.logical_to_spec(
        ("layers", "embed", "kv_heads", "head_dim"), (2, 16, 1, 4), mesh
    )
    assert spec == P(None, "fsdp", None, None)
    assert sharding.logical_to_spec(("batch", "embed"), (8, 16), mesh) == P(("data", "fsdp"), None)


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_sharded_model_matches_single_device(shape):
    mesh = sharding.make_mesh(*shape)
    model = sharding.create_sharded(_make(), mesh)
    specs = jax.tree.map(lambda a: a.sharding.spec, model.params())
    assert specs == EXPECTED_SPECS
    q = model.params()["layers"]["q"]
    assert q.addressable_shards[0].data.shape == (2, 16 // shape[1], 4 // shape[2], 4)

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, size=(8, 12)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[::3, :5] = 0
    batch = sharding.batch_sharding(mesh)
    run = jax.jit(lambda m, t, a: m(t, attention_mask=a))
    sharded = run(model, jax.device_put(tokens, batch), jax.device_put(mask, batch))

    host_params = jax.device_get(model.params())
    single = jax.device_put(host_params, jax.devices()[0])
    reference = run(from_params(CONFIG, single), tokens, mask)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(reference), atol=1e-5, rtol=0)


def test_from_params_places_on_mesh():
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    params = jax.device_get(nnx.jit(lambda: _make()().params())())
    model = from_params(CONFIG, params, mesh=mesh)
    assert model.params()["layers"]["gate"].sharding.spec == P(None, "fsdp", "tensor")
    np.testing.assert_array_equal(model.params()["embed"], params["embed"])


@pytest.mark.parametrize(
    "mesh_shape, rows, expected",
    [
        # kv heads over tensor where it divides them; rows over data and fsdp.
        ((2, 2, 2), 8, P(None, ("data", "fsdp"), None, "tensor", None)),
        # tensor 4 cannot split 2 kv heads: the heads stay whole, the rows take tensor
        # too, so no device holds another's rows.
        ((1, 2, 4), 8, P(None, ("data", "fsdp", "tensor"), None, None, None)),
        # ... unless tensor does not divide the rows either: then as before.
        ((1, 2, 4), 6, P(None, ("data", "fsdp"), None, None, None)),
        ((8, 1, 1), 4, P(None, None, None, None, None)),  # 4 rows cannot split 8 ways
    ],
)
def test_cache_spec_shards_the_rows_over_tensor_when_it_cannot_split_the_kv_heads(
    mesh_shape, rows, expected
):
    mesh = sharding.make_mesh(*mesh_shape)
    K = CONFIG.num_kv_heads
    assert sharding.cache_spec((2, rows, 5, K, 4), mesh) == expected


def test_residual_stream_splits_its_positions_over_tensor():
    """Inside sequence_split(True), constrain_residual lays a [B, L, D] stream out with B
    over data x fsdp and L over tensor (D whole), or as constrain_batch where tensor does
    not divide L; gather_sequence makes the rows whole again and scatter_sequence splits them (both
    no-ops where L does not split), each the identity on values and gradients."""
    mesh = sharding.make_mesh(1, 2, 4)
    batch = ("data", "fsdp")

    def layouts(x, on=True):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), sharding.sequence_split(on):
            r = sharding.constrain_residual(x)
            return r, sharding.gather_sequence(r), sharding.scatter_sequence(2 * x)

    def specs(L):
        x = jnp.arange(2 * L * 8, dtype=jnp.float32).reshape(2, L, 8)
        outs = jax.jit(layouts)(jax.device_put(x, NamedSharding(mesh, P())))
        np.testing.assert_array_equal(outs[1], x)
        np.testing.assert_array_equal(outs[2], 2 * x)
        return [o.sharding for o in outs]

    def same(got, *spec):
        return got.is_equivalent_to(NamedSharding(mesh, P(*spec)), 3)

    split, whole, scattered = specs(16)
    assert same(split, batch, "tensor", None) and same(scattered, batch, "tensor", None)
    assert same(whole, batch, None, None)
    # 4 does not divide 6: constrain_batch's layout, gather and scatter leave x as it is.
    split, whole, scattered = specs(6)
    assert same(split, batch, None, None) and same(whole, batch, None, None)
    assert same(scattered, None, None, None)
    # The identity's gradient, through both custom-VJP relayouts.
    x = jnp.ones((2, 16, 8))
    loss = jax.grad(lambda x: jnp.sum(jnp.stack(layouts(x)) ** 2))
    grad = jax.jit(loss)(jax.device_put(x, NamedSharding(mesh, P())))
    np.testing.assert_array_equal(grad, 2 * x + 2 * x + 8 * x)
    assert sharding.constrain_residual(x) is x  # no mesh: as is
    # Outside sequence_split(True) (rl.sequence_parallel off, the default): batch only.
    off = jax.jit(lambda x: layouts(x, on=False))(jax.device_put(x, NamedSharding(mesh, P())))
    assert same(off[0].sharding, batch, None, None) and same(off[2].sharding, None, None, None)
