"""Low-rank adapters (LoRA, Hu et al. 2021) on the decoder core's projections, PEFT's way.

An adapted projection computes y = x W + s (x A) B with the base W frozen, A [*in, r]
and B [r, *out] trained, s = alpha / r (PEFT's `scaling`). A starts as PEFT's
kaiming_uniform(a=sqrt(5)) of lora_A, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and B at
0, so the adapted model starts as the base. Adapters live in the params dict itself, next
to the weight they adapt (llama.py's layout, stacked on L):

  layers: {name}_lora_a [L,*in,r]   {name}_lora_b [L,r,*out]   lora_scale [L] (= s, frozen)

so every function of the core (forward, the sampler's prefill/decode, the RL forward)
applies them unchanged (llama._project). `split` separates what an update differentiates
(the adapters; the whole dict without them) from what stays frozen, and `merge` folds
them into dense weights (W + s A B) for export and for the exactness tests.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# The config lives in a jax-free module that kjax.rl.config (a leaf) can import.
from kjax.lora_config import ALL, LoraConfig, Projection, coerce

__all__ = [
    "ALL",
    "HF_MODULES",
    "LoraConfig",
    "Projection",
    "attach",
    "coerce",
    "delta",
    "fingerprint",
    "has_adapters",
    "is_adapter",
    "join",
    "merge",
    "peft_config",
    "peft_tensors",
    "same_base",
    "save_hf",
    "save_peft",
    "split",
    "targets_of",
]

Params = dict[str, Any]


# llama.py name -> (inputs contracted by the projection, PEFT/transformers module path).
_N_IN = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}
HF_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_SUFFIXES = ("_lora_a", "_lora_b")


def is_adapter(name: str) -> bool:
    return name.endswith(_SUFFIXES)


def has_adapters(params: Params) -> bool:
    return any(is_adapter(n) for n in params.get("layers", {}))


def attach(params: Params, cfg: LoraConfig, key: jax.Array) -> Params:
    """params with fresh adapters on cfg.targets (A as PEFT initializes it, B = 0).

    On a mesh, each adapter is laid out like the weight it adapts (_laid_out): A [L,*in,r]
    takes W's layout of L and the inputs, B [L,r,*out] of L and the outputs, the rank
    axis whole. So x A contracts over the inputs as x W does, and the adapters' gradients
    and optimizer moments are spread over the mesh like the base's (replicated, a 70B's
    rank-16 adapters with Adam's moments would hold ~2.4 GB on every chip).
    """
    if not cfg.enabled:
        return params
    if has_adapters(params):
        raise ValueError("attach: the params already carry LoRA adapters")
    layers = dict(params["layers"])
    keys = jax.random.split(key, len(cfg.targets))
    for p, k in zip(cfg.targets, keys, strict=True):
        w = layers[p.value]
        n_in = _N_IN[p.value]
        L, ins, outs = w.shape[0], w.shape[1 : 1 + n_in], w.shape[1 + n_in :]
        bound = 1 / math.sqrt(math.prod(ins))
        a = jax.random.uniform(k, (L, *ins, cfg.rank), jnp.float32, -bound, bound)
        b = jnp.zeros((L, cfg.rank, *outs), w.dtype)
        layers[f"{p.value}_lora_a"] = _laid_out(w, a.astype(w.dtype), range(1 + n_in), None)
        layers[f"{p.value}_lora_b"] = _laid_out(w, b, (0, *range(1 + n_in, w.ndim)), 1)
    L = layers["q"].shape[0]
    layers["lora_scale"] = _laid_out(layers["q"], jnp.full((L,), cfg.scale, jnp.float32), (), 0)
    return {**params, "layers": layers}


def _laid_out(w, x, kept, rank_at):
    """x on w's mesh with w's partition of the axes `kept` (w's axis indices, in order),
    the rank axis (inserted at rank_at; None: last) and any other whole. Unchanged off a
    mesh. lora_scale passes no axes: replicated."""
    sh = getattr(w, "sharding", None)
    if not isinstance(sh, jax.sharding.NamedSharding):
        return x
    spec = tuple(sh.spec) + (None,) * (w.ndim - len(sh.spec))
    axes = [spec[i] for i in kept]
    if kept:
        axes.insert(len(axes) if rank_at is None else rank_at, None)
    return jax.device_put(x, jax.sharding.NamedSharding(sh.mesh, jax.sharding.PartitionSpec(*axes)))


def split(params: Params) -> tuple[Params, Params]:
    """(trainable, frozen): with adapters, ({"layers": adapters}, everything else);
    without, (params, {}), so a full fine-tune's trees are unchanged."""
    if not has_adapters(params):
        return params, {}
    layers = params["layers"]
    trainable = {"layers": {n: x for n, x in layers.items() if is_adapter(n)}}
    frozen = {**params, "layers": {n: x for n, x in layers.items() if not is_adapter(n)}}
    return trainable, frozen


def join(trainable: Params, frozen: Params) -> Params:
    """Inverse of split."""
    if not frozen:
        return trainable
    return {**frozen, "layers": {**frozen["layers"], **trainable["layers"]}}


def delta(layers: Params, name: str) -> jax.Array:
    """s A B [L,*in,*out] float32 of projection `name` (its weight's shape)."""
    a = layers[f"{name}_lora_a"].astype(jnp.float32)
    b = layers[f"{name}_lora_b"].astype(jnp.float32)
    scale = layers["lora_scale"].astype(jnp.float32)
    n_in = _N_IN[name]
    L, r = a.shape[0], a.shape[-1]
    a2, b2 = a.reshape(L, -1, r), b.reshape(L, r, -1)
    d = jnp.einsum("lir,lro->lio", a2, b2, precision=jax.lax.Precision.HIGHEST)
    return (scale[:, None, None] * d).reshape(*a.shape[: 1 + n_in], *b.shape[2:])


def merge(params: Params) -> Params:
    """The dense params of the adapted model: W + s A B on every adapted projection, the
    adapters (and lora_scale) removed."""
    if not has_adapters(params):
        return params
    layers = {n: x for n, x in params["layers"].items() if not is_adapter(n)}
    layers.pop("lora_scale")
    for name in _N_IN:
        if f"{name}_lora_a" in params["layers"]:
            w = layers[name]
            layers[name] = (w.astype(jnp.float32) + delta(params["layers"], name)).astype(w.dtype)
    return {**params, "layers": layers}


def targets_of(params: Params) -> list[str]:
    """The adapted projections' llama.py names, in _N_IN order."""
    return [n for n in _N_IN if f"{n}_lora_a" in params.get("layers", {})]


def peft_tensors(params: Params) -> dict[str, np.ndarray]:
    """The adapters as PEFT saves them (adapter_model.safetensors): float32 lora_A.weight
    [r, in] and lora_B.weight [out, r] of each layer's module, torch's Linear layout with
    transformers' flattening of heads (h * E + e), scale excluded (adapter_config.json)."""
    layers = jax.device_get(params["layers"])
    out = {}
    for name in targets_of(params):
        a, b = np.asarray(layers[f"{name}_lora_a"]), np.asarray(layers[f"{name}_lora_b"])
        r = a.shape[-1]
        for i in range(a.shape[0]):
            prefix = f"base_model.model.model.layers.{i}.{HF_MODULES[name]}"
            out[f"{prefix}.lora_A.weight"] = a[i].reshape(-1, r).T.astype(np.float32)
            out[f"{prefix}.lora_B.weight"] = b[i].reshape(r, -1).T.astype(np.float32)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def peft_config(params: Params, base_model: str = "") -> dict[str, Any]:
    """adapter_config.json of params' adapters (PEFT's LoraConfig fields; rank and alpha
    read back from the arrays, so they are what the forward uses)."""
    names = targets_of(params)
    if not names:
        raise ValueError("peft_config: the params carry no LoRA adapters")
    rank = int(params["layers"][f"{names[0]}_lora_a"].shape[-1])
    scale = float(np.asarray(jax.device_get(params["layers"]["lora_scale"]))[0])
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": scale * rank,
        "lora_dropout": 0.0,
        "target_modules": [HF_MODULES[n].split(".")[-1] for n in names],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }


def save_peft(params: Params, out_dir: str, base_model: str = "") -> None:
    """Writes a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)
    that `peft.PeftModel.from_pretrained(base, out_dir)` loads onto the base model."""
    import json
    import os

    from safetensors.numpy import save_file

    config = peft_config(params, base_model)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file(
        peft_tensors(params),
        os.path.join(out_dir, "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )


def save_hf(params: Params, config, out_dir: str, base_model: str = "") -> None:
    """Exports an adapted model two ways: out_dir holds the merged dense model
    (kjax.models.save_hf of merge(params): transformers' from_pretrained reads it alone)
    and out_dir/adapter the PEFT adapter directory to load onto the base model
    (`base_model` is recorded as its base_model_name_or_path)."""
    import os

    from kjax.models.weights import from_params
    from kjax.models.weights import save_hf as save_dense

    save_dense(from_params(config, jax.device_get(merge(params))), out_dir)
    save_peft(params, os.path.join(out_dir, "adapter"), base_model)


# Odd multipliers (golden-ratio and murmur3 constants) of the two 32-bit checksums.
_K1, _K2 = 0x9E3779B1, 0x85EBCA6B
_FORMAT = "sum64"  # fingerprint's prefix; a bare hex digest is _host_fingerprint's


def _bits(x: jax.Array) -> jax.Array:
    """x's raw bits as uint32 (64-bit leaves folded hi ^ lo; bools and 8/16-bit widened)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    width = x.dtype.itemsize * 8
    u = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{width}"))
    if width == 64:
        return (u >> 32).astype(jnp.uint32) ^ u.astype(jnp.uint32)
    return u.astype(jnp.uint32)


@jax.jit
def _checksums(leaves: list[jax.Array]) -> jax.Array:
    """[len(leaves), 2] uint32: per leaf, two sums over its elements of
    ((bits ^ index * K) * odd) mod 2^32. Each term is a bijection of the element's bits at
    its flat index, and integer sums are exact in any order, so the result is the same on
    every mesh and host count, with each device summing only its own shards."""
    out = []
    for x in leaves:
        index = jnp.zeros(x.shape, jnp.uint32)
        for axis in range(x.ndim):  # the flat (row-major) index, mod 2^32
            index = index * jnp.uint32(x.shape[axis]) + jax.lax.broadcasted_iota(
                jnp.uint32, x.shape, axis
            )
        bits = _bits(x)
        out.append(
            jnp.stack(
                [
                    jnp.sum((bits ^ (index * jnp.uint32(_K1))) * jnp.uint32(_K2), dtype=jnp.uint32),
                    jnp.sum((bits ^ (index * jnp.uint32(_K2))) * jnp.uint32(_K1), dtype=jnp.uint32),
                ]
            )
        )
    return jnp.stack(out) if out else jnp.zeros((0, 2), jnp.uint32)


def _base_leaves(frozen: Params) -> list[tuple[str, jax.Array]]:
    leaves = [
        (jax.tree_util.keystr(path), x)
        for path, x in jax.tree_util.tree_leaves_with_path(frozen)
        if "lora_scale" not in jax.tree_util.keystr(path)  # the adapters' scale, not the base
    ]
    return sorted(leaves, key=lambda t: t[0])


def fingerprint(frozen: Params) -> str:
    """The frozen base's identity, "sum64:" + sha256 (hex) of every leaf's path, dtype,
    shape and two 32-bit checksums of its bits, in path order. What a checkpoint of
    adapters records, so they are never resumed onto another base. The checksums are
    computed on device where the arrays live (_checksums), so it works for arrays sharded
    over several hosts and moves 8 bytes per leaf to the host, not the weights."""
    leaves = _base_leaves(frozen)
    sums = np.asarray(jax.device_get(_checksums([x for _, x in leaves])))
    h = hashlib.sha256()
    for (path, x), (a, b) in zip(leaves, sums, strict=True):
        h.update(f"{path}|{np.dtype(x.dtype)}|{tuple(x.shape)}|{int(a)}|{int(b)}|".encode())
    return f"{_FORMAT}:{h.hexdigest()}"


def _host_fingerprint(frozen: Params) -> str:
    """The fingerprint checkpoints recorded before 2026-12-06's device-side one: sha256
    (hex) of every leaf's path, dtype, shape and bytes, read to the host (fully
    addressable arrays only). Kept to recognise those checkpoints' bases."""
    h = hashlib.sha256()
    for path, x in _base_leaves(frozen):
        a = np.asarray(jax.device_get(x))
        h.update(f"{path}|{a.dtype}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def same_base(saved: str | None, frozen: Params, current: str) -> bool:
    """Whether a checkpoint's recorded base fingerprint `saved` is the base `frozen`
    (whose fingerprint is `current`); a bare digest is compared the old way."""
    if saved is None:
        return False
    if saved == current:
        return True
    return ":" not in saved and saved == _host_fingerprint(frozen)
