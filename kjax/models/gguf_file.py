"""GGUF (llama.cpp) import: metadata -> LlamaConfig, tensors -> transformers names/layouts.

Quantized tensors are dequantized to float32 with the `gguf` package's quants module;
llama.cpp's row permutation of q/k (for its interleaved RoPE) is undone.
"""

from __future__ import annotations

import os
import re

import numpy as np

from kjax.models.config import LlamaConfig

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(gguf_name: str) -> str:
    """transformers' name of a llama.cpp tensor; unknown names come back unchanged
    (so the strict name map reports them)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    return gguf_name


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order: per head, rows (pairs, 2) -> (2, pairs).

    llama.cpp rotates adjacent pairs; transformers rotates the two halves of a head.
    w: [num_heads * E, D] rows as stored in the GGUF.
    """
    rows = w.shape[0]
    return (
        w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _config(meta: dict, tensor_names: set[str], path: str) -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture={arch!r}, kjax loads only 'llama'")
    if "rope_freqs.weight" in tensor_names or meta.get("llama.rope.scaling.type", "none") != "none":
        raise ValueError(
            f"{path}: RoPE scaling in a GGUF (rope_freqs.weight / llama.rope.scaling.type) is "
            "not supported; load the model's HF directory instead"
        )
    heads = int(meta["llama.attention.head_count"])
    dim = int(meta["llama.embedding_length"])
    vocab = meta.get("llama.vocab_size") or meta.get("_num_tokens")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=dim,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_layers=int(meta["llama.block_count"]),
        num_heads=heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=int(meta.get("llama.attention.key_length", dim // heads)),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        tie_embeddings="output.weight" not in tensor_names,
        bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_ids=() if eos is None else (int(eos),),
        max_position_embeddings=int(meta.get("llama.context_length", 2048)),
    )


def read_gguf(path: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Reads a llama-architecture .gguf: (config, float32 tensors with transformers names)."""
    import gguf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path} not found")
    reader = gguf.GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            if key == "tokenizer.ggml.tokens":
                meta["_num_tokens"] = len(field.data)
            continue  # large arrays the model does not need
        meta[key] = field.contents()
    names = {t.name for t in reader.tensors}
    config = _config(meta, names, path)
    tensors = {}
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise ValueError(
                f"{path}: tensor {t.name} has type {t.tensor_type.name}; supported: "
                f"{', '.join(SUPPORTED_TYPES)}"
            )
        shape = tuple(int(n) for n in reversed(t.shape))  # ggml lists dims innermost first
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            w = unpermute_qk(w, config.num_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_qk(w, config.num_kv_heads)
        tensors[name] = w
    return config, tensors
