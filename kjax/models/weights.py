"""Real weights: HF safetensors import/export and GGUF import, through one strict name map.

Every format is first turned into transformers' tensor names and layouts; `hf_to_params`
then checks the set of names and every shape against the config before anything is built.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from kjax import sharding
from kjax.models.config import LlamaConfig
from kjax.models.llama import Llama

# Non-persistent RoPE buffers some older exports still carry; recomputed from the config.
_DERIVED_SUFFIX = "rotary_emb.inv_freq"
_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
}


def _layer_names(i: int, c: LlamaConfig) -> dict[str, str]:
    """kjax layer key -> transformers tensor name of layer i (the family's tensors only)."""
    p = f"model.layers.{i}."
    names = {
        "attn_norm": p + "input_layernorm.weight",
        "q": p + "self_attn.q_proj.weight",
        "k": p + "self_attn.k_proj.weight",
        "v": p + "self_attn.v_proj.weight",
        "o": p + "self_attn.o_proj.weight",
        "mlp_norm": p + "post_attention_layernorm.weight",
        "gate": p + "mlp.gate_proj.weight",
        "up": p + "mlp.up_proj.weight",
        "down": p + "mlp.down_proj.weight",
    }
    if c.qkv_bias:
        names |= {f"{x}_bias": p + f"self_attn.{x}_proj.bias" for x in "qkv"}
    if c.qk_norm:
        names |= {f"{x}_norm": p + f"self_attn.{x}_norm.weight" for x in "qk"}
    return names


def _hf_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    D, F, H, K, E = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    per_layer = {
        "attn_norm": (D,),
        "q": (H * E, D),
        "k": (K * E, D),
        "v": (K * E, D),
        "o": (D, H * E),
        "mlp_norm": (D,),
        "gate": (F, D),
        "up": (F, D),
        "down": (D, F),
        "q_bias": (H * E,),
        "k_bias": (K * E,),
        "v_bias": (K * E,),
        "q_norm": (E,),
        "k_norm": (E,),
    }
    shapes = {"model.embed_tokens.weight": (c.vocab_size, D), "model.norm.weight": (D,)}
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, D)
    for i in range(c.num_layers):
        shapes.update({name: per_layer[key] for key, name in _layer_names(i, c).items()})
    return shapes


def _to_kjax(key: str, w: np.ndarray, c: LlamaConfig) -> np.ndarray:
    """One layer tensor from torch's Linear [out, in] layout to kjax's (module docstring)."""
    H, K, E, D = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
    if key == "q":
        return w.reshape(H, E, D).transpose(2, 0, 1)
    if key in ("k", "v"):
        return w.reshape(K, E, D).transpose(2, 0, 1)
    if key == "o":
        return w.reshape(D, H, E).transpose(1, 2, 0)
    if key in ("gate", "up", "down"):
        return w.T
    if key == "q_bias":
        return w.reshape(H, E)
    if key in ("k_bias", "v_bias"):
        return w.reshape(K, E)
    return w


def _to_hf(key: str, w: np.ndarray) -> np.ndarray:
    if key in ("q", "k", "v"):
        return w.reshape(w.shape[0], -1).T
    if key == "o":
        return w.reshape(-1, w.shape[-1]).T
    if key in ("gate", "up", "down"):
        return w.T
    if key.endswith("_bias"):
        return w.reshape(-1)
    return w


def hf_to_params(tensors: Mapping[str, np.ndarray], config: LlamaConfig, source: str = "weights"):
    """Strictly maps transformers-named tensors to the kjax params dict (numpy arrays).

    Raises ValueError naming any missing, unexpected or mis-shaped tensor of `source`.
    """
    tensors = {k: v for k, v in tensors.items() if not k.endswith(_DERIVED_SUFFIX)}
    expected = _hf_shapes(config)
    if config.tie_embeddings and "lm_head.weight" in tensors:
        # Some tied exports store the head anyway; accept it only if it is the embedding.
        if not np.array_equal(tensors["lm_head.weight"], tensors.get("model.embed_tokens.weight")):
            raise ValueError(
                f"{source}: lm_head.weight differs from the embedding but the config says "
                "tie_word_embeddings=true; set it to false"
            )
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(
            f"{source} does not match the config: missing tensors {missing[:8]}, unexpected "
            f"tensors {extra[:8]} (check the config's layer count, tying and architecture)"
        )
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"{source}: tensor {name} has shape {tuple(tensors[name].shape)}, the config "
                f"implies {shape}"
            )
    layers = {
        key: np.stack(
            [
                _to_kjax(key, np.asarray(tensors[_layer_names(i, config)[key]]), config)
                for i in range(config.num_layers)
            ]
        )
        for key in _layer_names(0, config)
    }
    params = {
        "embed": np.asarray(tensors["model.embed_tokens.weight"]),
        "layers": layers,
        "final_norm": np.asarray(tensors["model.norm.weight"]),
    }
    if not config.tie_embeddings:
        params["lm_head"] = np.asarray(tensors["lm_head.weight"]).T
    return params


def params_to_hf(params, config: LlamaConfig) -> dict[str, np.ndarray]:
    """Inverse of `hf_to_params`: transformers names and layouts, float32 numpy arrays."""
    f32 = lambda a: np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    out = {
        "model.embed_tokens.weight": f32(params["embed"]),
        "model.norm.weight": f32(params["final_norm"]),
    }
    if not config.tie_embeddings:
        out["lm_head.weight"] = f32(np.asarray(params["lm_head"]).T)
    for key in _layer_names(0, config):
        stacked = np.asarray(params["layers"][key], dtype=np.float32)
        for i in range(config.num_layers):
            out[_layer_names(i, config)[key]] = f32(_to_hf(key, stacked[i]))
    return out


def from_params(
    config: LlamaConfig,
    params,
    *,
    param_dtype=jnp.float32,
    dtype=jnp.float32,
    remat: bool = False,
    mesh=None,
) -> Llama:
    """Builds a `Llama` holding `params` (a params dict of array-likes) without random init.

    With a `mesh` (kjax.sharding.make_mesh) each parameter goes straight to its shards.
    """
    abstract = nnx.eval_shape(
        lambda: Llama(config, rngs=nnx.Rngs(0), param_dtype=param_dtype, dtype=dtype, remat=remat)
    )
    graphdef, state = nnx.split(abstract)
    shape_check = jax.tree.map(lambda a: a.shape, nnx.to_pure_dict(state))
    got = jax.tree.map(lambda a: tuple(np.shape(a)), params)
    if got != shape_check:
        raise ValueError(f"params do not match the model layout: {got} != {shape_check}")
    arrays = jax.tree.map(lambda a: np.asarray(a).astype(param_dtype), params)
    if mesh is not None:
        shardings = nnx.to_pure_dict(sharding.shardings_for(state, mesh))
        arrays = jax.tree.map(jax.device_put, arrays, shardings)
    else:
        arrays = jax.tree.map(jnp.asarray, arrays)
    nnx.replace_by_pure_dict(state, arrays)
    return nnx.merge(graphdef, state)


# ----------------------------------------------------------------------------- safetensors


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Memory-maps a .safetensors file into numpy arrays (bfloat16 via ml_dtypes)."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if 8 + header_len > size:
                raise ValueError(f"a {header_len}-byte header in {size} bytes")
            header = json.loads(f.read(header_len))
        end = max((i["data_offsets"][1] for n, i in header.items() if n != "__metadata__"),
                  default=0)  # fmt: skip
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path} is not a readable safetensors file ({e}); download or save it again."
        ) from None
    if 8 + header_len + end > size:
        raise ValueError(
            f"{path} is truncated: its header lists {8 + header_len + end} bytes, the file has "
            f"{size} (an interrupted download or copy?); download or save it again."
        )
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        out[name] = raw[start:end].view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def _read_hf_dir(path: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path} not found: a HF model directory needs config.json")
    with open(config_path) as f:
        try:
            hf = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{config_path} is not valid JSON ({e}; cut short?); copy the model's "
                "config.json there again."
            ) from None
    config = LlamaConfig.from_hf(hf)
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(single):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(
            f"{path} has neither model.safetensors nor model.safetensors.index.json "
            "(PyTorch .bin checkpoints are not read: convert them to safetensors)"
        )
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(path, name)))
    return config, tensors


def load(
    path: str, *, dtype=jnp.float32, param_dtype=None, remat: bool = False, mesh=None
) -> Llama:
    """Loads a HF model directory (safetensors) or a `.gguf` file as a `Llama` of the
    family its config.json `model_type` (or GGUF architecture) names.

    Args:
      path: directory with config.json + model.safetensors (or a sharded
        model.safetensors.index.json), or a .gguf file.
      dtype: compute dtype; param_dtype defaults to it.
      mesh: place the parameters on this mesh (kjax.sharding rules).
    """
    if path.endswith(".gguf"):
        from kjax.models.gguf_file import read_gguf

        config, tensors = read_gguf(path)
    elif os.path.isdir(path):
        config, tensors = _read_hf_dir(path)
    else:
        raise FileNotFoundError(f"{path} is neither a HF model directory nor a .gguf file")
    params = hf_to_params(tensors, config, source=path)
    return from_params(
        config, params, param_dtype=param_dtype or dtype, dtype=dtype, remat=remat, mesh=mesh
    )


def save_hf(model: Llama, out_dir: str) -> None:
    """Writes config.json + model.safetensors (float32) for transformers' from_pretrained."""
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    hf_config = model.config.to_hf() | {"dtype": "float32"}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    tensors = params_to_hf(jax.device_get(model.params()), model.config)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
