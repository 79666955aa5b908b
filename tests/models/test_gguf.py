"""GGUF import: synthetic llama.cpp-style files vs the original weights and vs
transformers' own GGUF loader; every supported tensor type appears once or more."""

import os

import gguf
import jax
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q

from kjax.models import load
from kjax.models.gguf_file import hf_name
from tests.models.hf_reference import hf_logits, random_hf_model

# K-quants need rows (the input dim) that are multiples of 256.
SHAPE = dict(
    vocab_size=11,
    hidden_size=256,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
)
TYPES = {  # GGUF tensor name -> type; the rest are F32
    "token_embd.weight": Q.Q8_0,
    "output.weight": Q.F16,
    "blk.0.attn_q.weight": Q.Q4_0,
    "blk.0.attn_k.weight": Q.Q4_1,
    "blk.0.attn_v.weight": Q.Q4_K,
    "blk.0.attn_output.weight": Q.Q6_K,
    "blk.0.ffn_gate.weight": Q.BF16,
    "blk.1.attn_q.weight": Q.Q6_K,
    "blk.1.attn_k.weight": Q.Q4_K,
    "blk.1.ffn_down.weight": Q.Q8_0,
}
TOKENS = np.random.default_rng(0).integers(0, 11, size=(2, 10)).astype(np.int32)
_GGUF_TO_HF = {  # inverse of kjax's map, written out independently
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
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


def _permute(w, heads):
    """llama.cpp's convert step: each head's rows go from (2, pairs) to (pairs, 2)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def _random_k_blocks(rows, cols, qtype, rng):
    """Random Q4_K/Q6_K bytes with sane float16 scales (gguf cannot quantize to these)."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    if qtype == Q.Q4_K:  # d, dmin come first
        raw[..., 0:2], raw[..., 2:4] = scale, scale
    else:  # Q6_K: d comes last
        raw[..., -2:] = scale
    return raw.reshape(rows, -1)


def write_gguf(hf, path, types):
    cfg, rng = hf.config, np.random.default_rng(1)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    state = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    names = dict(_GGUF_TO_HF)
    for i in range(cfg.num_hidden_layers):
        names.update(
            {f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight" for g, h in _LAYER.items()}
        )
    for name, hf_key in names.items():
        w = state[hf_key]
        if name.endswith("attn_q.weight"):
            w = _permute(w, cfg.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            w = _permute(w, cfg.num_key_value_heads)
        qtype = types.get(name, Q.F32)
        if qtype in (Q.Q4_K, Q.Q6_K):
            writer.add_tensor(name, _random_k_blocks(*w.shape, qtype, rng), raw_dtype=qtype)
        elif qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, w.astype(np.float16 if qtype == Q.F16 else np.float32))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@jax.jit
def _run(model, tokens):
    return model(tokens)


def test_float32_gguf_reproduces_the_original_model(tmp_path):
    hf = random_hf_model(seed=12, std=0.05, **SHAPE)
    model = load(write_gguf(hf, tmp_path / "m.gguf", {}))
    assert not model.config.tie_embeddings and model.config.head_dim == 64
    np.testing.assert_allclose(_run(model, TOKENS), hf_logits(hf, TOKENS), atol=1e-5, rtol=0)


def test_quantized_gguf_matches_transformers_gguf_loader(tmp_path):
    hf = random_hf_model(seed=13, std=0.05, **SHAPE)
    path = write_gguf(hf, tmp_path / "q.gguf", TYPES)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert {types[n] for n in TYPES} == set(TYPES.values())
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="q.gguf", attn_implementation="eager", dtype=torch.float32
    ).eval()
    ours = _run(load(path), TOKENS)
    np.testing.assert_allclose(ours, hf_logits(reference, TOKENS), atol=1e-5, rtol=0)
    # the quantized tensors really changed the model (Q4_K/Q6_K ones are random bytes)
    assert np.abs(np.asarray(ours) - hf_logits(hf, TOKENS)).max() > 1e-3


def test_unknown_tensor_and_type_are_named(tmp_path):
    hf = random_hf_model(seed=14, **SHAPE)
    path = write_gguf(hf, tmp_path / "x.gguf", {"blk.1.ffn_up.weight": Q.Q5_0})
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight has type Q5_0"):
        load(path)
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.attn_q_norm.weight") == "blk.0.attn_q_norm.weight"
    with pytest.raises(FileNotFoundError):
        load(os.path.join(tmp_path, "missing.gguf"))
