"""Weights of Qwen2, Qwen3 and Mistral in and out: transformers' safetensors directories
(sharded too), save_hf reloaded by transformers, llama.cpp GGUFs of qwen2/qwen3, and the
strict name map naming a missing tensor."""

import gguf
import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from kjax.models import Family, load, save_hf
from tests.models.hf_reference import hf_logits, kjax_from_hf, random_family_model

TOKENS = np.random.default_rng(0).integers(0, 11, size=(2, 9)).astype(np.int32)
FAMILIES = {  # model_type -> overrides switching its features on (window 4 < 9 tokens)
    "qwen2": dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "qwen3": dict(head_dim=6, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "mistral": dict(sliding_window=4),
}


@jax.jit
def _run(model, tokens):
    return model(tokens)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_save_hf_reloads_in_transformers_and_sharded_dirs_load(tmp_path, family):
    hf = random_family_model(family, seed=21, **FAMILIES[family])
    model = kjax_from_hf(hf)
    save_hf(model, str(tmp_path))
    back = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), attn_implementation="eager"
    ).eval()
    assert type(back) is type(hf)
    assert back.config.sliding_window == hf.config.sliding_window
    if family != "mistral":  # Mistral's window is on every layer, it has no layer_types
        assert back.config.layer_types == hf.config.layer_types
    for name, p in hf.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], p, rtol=0, atol=0)
    np.testing.assert_array_equal(hf_logits(back, TOKENS), hf_logits(hf, TOKENS))
    np.testing.assert_allclose(_run(model, TOKENS), hf_logits(back, TOKENS), atol=1e-5, rtol=0)
    # transformers' own save, sharded into several files with an index, read by kjax
    back.save_pretrained(str(tmp_path / "sharded"), max_shard_size="4KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    again = load(str(tmp_path / "sharded"))
    assert again.config == model.config
    np.testing.assert_array_equal(_run(again, TOKENS), _run(model, TOKENS))


@pytest.mark.parametrize(
    "family,tensor",
    [
        ("qwen2", "model.layers.1.self_attn.k_proj.bias"),
        ("qwen3", "model.layers.0.self_attn.q_norm.weight"),
    ],
)
def test_missing_family_tensor_is_named(tmp_path, family, tensor):
    random_family_model(family, seed=22).save_pretrained(str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors.pop(tensor)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"missing tensors \['{tensor}'\]"):
        load(str(tmp_path))


# ----------------------------------------------------------------------------- GGUF

_GGUF_GLOBAL = {  # llama.cpp name -> transformers name, written out independently of kjax
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",  # qwen2
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # qwen3
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}


def _write_gguf(hf, arch, path):
    """A float32 GGUF as llama.cpp's qwen2/qwen3 converters write it (no q/k permutation)."""
    cfg = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(hf.model.layers[0].self_attn.head_dim)
    writer.add_value_length(hf.model.layers[0].self_attn.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    state = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    names = dict(_GGUF_GLOBAL)
    for i in range(cfg.num_hidden_layers):
        names |= {f"blk.{i}.{g}": f"model.layers.{i}.{h}" for g, h in _GGUF_LAYER.items()}
    for name, hf_key in names.items():
        if hf_key in state:
            writer.add_tensor(name, state[hf_key])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_gguf_reproduces_the_model_and_transformers_gguf_loader(tmp_path, arch):
    # Qwen3's head_dim 128 != 16/2 comes from {arch}.attention.key_length (transformers'
    # GGUF loader ignores that key and takes Qwen3Config's default, also 128).
    head_dim = 128 if arch == "qwen3" else 8
    overrides = dict(num_attention_heads=2, num_key_value_heads=1)
    if arch == "qwen3":
        overrides["head_dim"] = head_dim
    hf = random_family_model(arch, seed=23, std=0.1, **overrides)
    path = _write_gguf(hf, arch, tmp_path / "m.gguf")
    model = load(path)
    assert model.config.family is Family(arch) and model.config.head_dim == head_dim
    np.testing.assert_allclose(_run(model, TOKENS), hf_logits(hf, TOKENS), atol=1e-5, rtol=0)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="m.gguf", attn_implementation="eager", dtype=torch.float32
    ).eval()
    np.testing.assert_allclose(hf_logits(reference, TOKENS), hf_logits(hf, TOKENS), atol=1e-5)


def test_gguf_of_another_architecture_is_refused(tmp_path):
    hf = random_family_model("qwen2", seed=24)
    path = _write_gguf(hf, "gemma3", tmp_path / "g.gguf")
    with pytest.raises(ValueError, match=r"architecture='gemma3'.*\['llama', 'qwen2', 'qwen3'\]"):
        load(path)
