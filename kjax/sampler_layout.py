"""The rollout's weight layout (kjax.sampler_weights.SamplerWeights): the params resharded
for the sampler once per rollout, the per-chip bytes of a layout, and AUTO's choice.

Under the trainer's layout (fsdp x tensor) every decode step all-gathers each layer's
weights over fsdp: the 8B decode on v6e-64 moved 1.6 GB per chip over the interconnect
per step (8 ms at 200 GB/s, against about 1.3 ms of HBM traffic), so the sampler was
interconnect-bound at every window. SamplerWeights.TENSOR reshards the weights once per
rollout (one all-gather over fsdp, before the prefill) to tensor only: each chip then
reads its tensor shard every step and nothing is gathered per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from kjax import sharding
from kjax.models import llama
from kjax.models.config import LlamaConfig
from kjax.sampler_weights import SamplerWeights

_AUTO_SHARE = 0.8  # AUTO's TENSOR while weights + KV cache + resident state <= this of HBM


def weight_axes(config: LlamaConfig) -> dict[tuple[str, ...], tuple]:
    """{path of a params leaf ("layers", "q"): its logical axes}, as the Llama module
    declares them (no array is allocated)."""
    model = nnx.eval_shape(lambda: llama.Llama(config, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {tuple(map(str, path)): v.get_metadata().get("axes") for path, v in flat}


def weight_rules(weights: SamplerWeights):
    """The logical-axis rules of a weight layout: TENSOR replicates the embed axis
    (sharding.RULES's fsdp) and keeps the rest; TRAIN is sharding.RULES."""
    if weights is SamplerWeights.TENSOR:
        return {**sharding.RULES, "embed": None}
    return sharding.RULES


def _specs(config: LlamaConfig, mesh, weights: SamplerWeights):
    """path, x -> the PartitionSpec of a params leaf in layout `weights` on `mesh`, None
    for a leaf the Llama module does not declare (LoRA adapters: left as they are)."""
    axes, rules = weight_axes(config), weight_rules(weights)

    def spec(path, x):
        names = axes.get(tuple(str(getattr(k, "key", k)) for k in path))
        if names is None or len(names) != len(x.shape):
            return None
        return sharding.logical_to_spec(names, x.shape, mesh, rules)

    return spec


def sampler_params(params, config: LlamaConfig, weights: SamplerWeights):
    """params in the rollout's layout (SamplerWeights), under the traced mesh: TENSOR
    all-gathers each weight over fsdp once here, and every decode step then reads the
    gathered copy; TRAIN (and anything without a mesh, one device included) as they are."""
    mesh = jax.sharding.get_abstract_mesh()
    if weights is not SamplerWeights.TENSOR or mesh.empty:
        return params
    spec = _specs(config, mesh, weights)

    def one(path, x):
        s = spec(path, x)
        return x if s is None else jax.lax.with_sharding_constraint(x, s)

    return jax.tree_util.tree_map_with_path(one, params)


def per_chip_bytes(shape, spec, mesh, itemsize: int) -> int:
    """Bytes one chip holds of an array of `shape` laid out by PartitionSpec `spec`."""
    shard = NamedSharding(mesh, spec).shard_shape(tuple(shape))
    return int(np.prod(shard)) * itemsize


def weight_bytes(params, config: LlamaConfig, mesh, weights: SamplerWeights) -> int:
    """Bytes one chip holds of params (sharded arrays or ShapeDtypeStructs) in layout
    `weights` on `mesh`; a leaf the Llama module does not declare in its own sharding."""
    spec = _specs(config, mesh, weights)

    def one(path, x):
        s = spec(path, x)
        s = x.sharding.spec if s is None else s
        return per_chip_bytes(x.shape, s, mesh, jnp.dtype(x.dtype).itemsize)

    return int(sum(jax.tree.leaves(jax.tree_util.tree_map_with_path(one, params))))


def resolve_weights(weights: SamplerWeights, params, config: LlamaConfig, mesh, *,
                    cache_bytes: int, resident_bytes: int,
                    hbm_bytes: int | None) -> SamplerWeights:  # fmt: skip
    """TRAIN or TENSOR for `weights` (AUTO: TENSOR where fsdp > 1 and the TENSOR weights
    per chip + cache_bytes (the K/V cache per chip) + resident_bytes (what stays
    allocated beside the sampler: the train state) fit _AUTO_SHARE of hbm_bytes; TRAIN
    without a memory figure (CPUs) or where fsdp is 1). params: arrays or
    ShapeDtypeStructs."""
    if weights is not SamplerWeights.AUTO:
        return weights
    if mesh is None or mesh.shape.get("fsdp", 1) == 1 or not hbm_bytes:
        return SamplerWeights.TRAIN
    held = weight_bytes(params, config, mesh, SamplerWeights.TENSOR)
    fits = held + cache_bytes + resident_bytes <= _AUTO_SHARE * hbm_bytes
    return SamplerWeights.TENSOR if fits else SamplerWeights.TRAIN


def params_mesh(params):
    """The Mesh of params laid out over more than one device (their first NamedSharding
    leaf's), or None (one device, or arrays without a NamedSharding)."""
    for x in jax.tree.leaves(params):
        sh = getattr(x, "sharding", None)
        if isinstance(sh, NamedSharding) and sh.mesh.size > 1:
            return sh.mesh
    return None


def for_rollout(params, config: LlamaConfig, weights: SamplerWeights, cache_shapes,
                itemsize: int):  # fmt: skip
    """params placed, outside any jit, in the rollout's layout `weights` on their own mesh
    (the public samplers: kjax.sampling.sample, kjax.pruned_sampling.sample_pruned; the
    trainer's reshards inside its jitted sampler, sampler_params). AUTO is resolved by
    resolve_weights from the first device's memory limit, the K/V caches `cache_shapes`
    ([L, rows, length, K, E] each, keys and values, itemsize bytes) and the params
    themselves, which stay allocated beside the copy. TENSOR puts each weight on tensor
    only (one all-gather over fsdp, here); TRAIN, params without a mesh, and AUTO on
    CPUs (no memory figure) leave params as they are."""
    mesh = params_mesh(params)
    if mesh is None or weights is SamplerWeights.TRAIN:
        return params
    if weights is SamplerWeights.AUTO:
        try:
            stats = mesh.devices.flat[0].memory_stats() or {}
        except Exception:  # a backend without memory statistics  # noqa: BLE001
            stats = {}
        cache = sum(
            2 * per_chip_bytes(s, sharding.cache_spec(s, mesh), mesh, itemsize)
            for s in cache_shapes
        )
        held = weight_bytes(params, config, mesh, SamplerWeights.TRAIN)
        hbm = stats.get("bytes_limit")
        weights = resolve_weights(weights, params, config, mesh, cache_bytes=cache,
                                  resident_bytes=held, hbm_bytes=hbm)  # fmt: skip
    if weights is not SamplerWeights.TENSOR:
        return params
    spec = _specs(config, mesh, weights)

    def one(path, x):
        s = spec(path, x)
        return x if s is None else jax.device_put(x, NamedSharding(mesh, s))

    return jax.tree_util.tree_map_with_path(one, params)
