"""GGUF (llama.cpp) import: metadata -> LlamaConfig, tensors -> transformers names/layouts.

Architectures: llama, qwen2 (q/k/v biases) and qwen3 (q/k norms), each with its own strict
tensor-name map. Quantized tensors are dequantized to float32 with the `gguf` package's
quants module; llama.cpp's row permutation of a llama's q/k (for its interleaved RoPE) is
undone (its qwen2/qwen3 converters do not permute: they rotate halves, as transformers).
"""

from __future__ import annotations

import os
import re

import numpy as np

from kjax.models.config import Family, LlamaConfig

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
_EXTRA_NAMES = {  # per family, the layer tensors beyond Llama's
    Family.LLAMA: {},
    Family.QWEN2: {},
    Family.QWEN3: {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
}
_BIASED = {Family.QWEN2: ("attn_q", "attn_k", "attn_v")}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
ARCHITECTURES = {family.value: family for family in _EXTRA_NAMES}


def hf_name(gguf_name: str, family: Family = Family.LLAMA) -> str:
    """transformers' name of a llama.cpp tensor of `family`; unknown names come back
    unchanged (so the strict name map reports them)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if not m:
        return gguf_name
    layer, kind, suffix = m.groups()
    names = _LAYER_NAMES | _EXTRA_NAMES[family]
    if kind not in names or (suffix == "bias" and kind not in _BIASED.get(family, ())):
        return gguf_name
    return f"model.layers.{layer}.{names[kind]}.{suffix}"


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
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{path}: general.architecture={arch!r}, kjax loads only {sorted(ARCHITECTURES)}"
        )
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    if "rope_freqs.weight" in tensor_names or meta.get(key("rope.scaling.type"), "none") != "none":
        raise ValueError(
            f"{path}: RoPE scaling in a GGUF (rope_freqs.weight / {arch}.rope.scaling.type) is "
            "not supported; load the model's HF directory instead"
        )
    heads = int(meta[key("attention.head_count")])
    dim = int(meta[key("embedding_length")])
    vocab = meta.get(key("vocab_size")) or meta.get("_num_tokens")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=dim,
        intermediate_size=int(meta[key("feed_forward_length")]),
        num_layers=int(meta[key("block_count")]),
        num_heads=heads,
        num_kv_heads=int(meta.get(key("attention.head_count_kv"), heads)),
        head_dim=int(meta.get(key("attention.key_length"), dim // heads)),
        rope_theta=float(meta.get(key("rope.freq_base"), 10000.0)),
        rms_norm_eps=float(meta[key("attention.layer_norm_rms_epsilon")]),
        tie_embeddings="output.weight" not in tensor_names,
        bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_ids=() if eos is None else (int(eos),),
        max_position_embeddings=int(meta.get(key("context_length"), 2048)),
        family=ARCHITECTURES[arch],
    )


def check_gguf(path: str) -> None:
    """Raises a ValueError naming `path` when it is empty or not a GGUF file (the gguf
    package's own messages, "GGUF magic invalid" or an mmap error, name neither)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if not magic:
        raise ValueError(f"{path} is empty (0 bytes; an interrupted download?); download it again.")
    if magic != b"GGUF":
        raise ValueError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); give a .gguf "
            "from llama.cpp's converter, or a HF model folder with --config.model.kind=hf_dir."
        )


def read_gguf(path: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Reads a llama/qwen2/qwen3 .gguf: (config, float32 tensors with transformers names)."""
    import gguf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path} not found")
    check_gguf(path)
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
        name = hf_name(t.name, config.family)
        permuted = config.family is Family.LLAMA  # qwen2/qwen3 keep transformers' rows
        if permuted and name.endswith("q_proj.weight"):
            w = unpermute_qk(w, config.num_heads)
        elif permuted and name.endswith("k_proj.weight"):
            w = unpermute_qk(w, config.num_kv_heads)
        tensors[name] = w
    return config, tensors
