"""HF safetensors round trips through transformers, and strict errors on bad inputs."""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from kjax.models import LlamaConfig, load, save_hf
from kjax.models.weights import hf_to_params
from tests.models.hf_reference import hf_logits, kjax_from_hf, random_hf_model

TOKENS = np.random.default_rng(0).integers(0, 11, size=(2, 9)).astype(np.int32)


@jax.jit
def _run(model, tokens):
    return model(tokens)


@pytest.mark.parametrize("tied", [False, True])
def test_save_hf_loads_in_transformers_with_identical_logits(tmp_path, tied):
    hf = random_hf_model(
        seed=7,
        tie_word_embeddings=tied,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500.0,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 2.0,
            "original_max_position_embeddings": 16,
        },
    )
    model = kjax_from_hf(hf)
    save_hf(model, str(tmp_path))
    back = transformers.LlamaForCausalLM.from_pretrained(
        str(tmp_path), attn_implementation="eager"
    ).eval()
    assert back.config.tie_word_embeddings == tied
    for name, p in hf.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], p, rtol=0, atol=0)
    np.testing.assert_array_equal(hf_logits(back, TOKENS), hf_logits(hf, TOKENS))
    np.testing.assert_allclose(_run(model, TOKENS), hf_logits(back, TOKENS), atol=1e-5, rtol=0)
    # ... and back: transformers' own save, read by kjax.models.load
    back.save_pretrained(str(tmp_path / "back"))
    again = load(str(tmp_path / "back"))
    np.testing.assert_array_equal(_run(again, TOKENS), _run(model, TOKENS))


def test_load_transformers_checkpoint_sharded_index(tmp_path):
    hf = random_hf_model(seed=8, hidden_size=32, intermediate_size=64)
    hf.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    model = load(str(tmp_path))
    np.testing.assert_allclose(_run(model, TOKENS), hf_logits(hf, TOKENS), atol=1e-5, rtol=0)


def test_load_bfloat16_checkpoint(tmp_path):
    hf = random_hf_model(seed=9).to(torch.bfloat16)
    hf.save_pretrained(str(tmp_path))
    model = load(str(tmp_path))
    assert model.params()["embed"].dtype == np.float32
    np.testing.assert_array_equal(
        np.asarray(model.params()["final_norm"]),
        hf.model.norm.weight.float().detach().numpy(),
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    random_hf_model(seed=10).save_pretrained(str(path))
    return path


def _edit(checkpoint, tmp_path, edit_tensors=None, edit_config=None):
    tensors = load_file(str(checkpoint / "model.safetensors"))
    config = json.loads((checkpoint / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_missing_tensor_is_named(checkpoint, tmp_path):
    path = _edit(checkpoint, tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(
        ValueError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"
    ):
        load(path)


def test_extra_tensor_is_named(checkpoint, tmp_path):
    def add(t):
        t["model.layers.2.input_layernorm.weight"] = np.ones(16, np.float32)

    with pytest.raises(ValueError, match="unexpected tensors.*layers.2.input_layernorm"):
        load(_edit(checkpoint, tmp_path, add))


def test_misshaped_tensor_is_named(checkpoint, tmp_path):
    def bad(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((4, 16), np.float32)

    with pytest.raises(ValueError, match=r"k_proj.weight has shape \(4, 16\).*\(8, 16\)"):
        load(_edit(checkpoint, tmp_path, bad))


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("sliding_window", 128, "unknown config.json field 'sliding_window'"),
        (
            "rope_parameters",
            {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
            "rope_type='yarn' is not supported",
        ),
        ("attention_bias", True, "'attention_bias'=True is not supported"),
    ],
)
def test_unsupported_config_field_is_named(checkpoint, tmp_path, field, value, message):
    path = _edit(checkpoint, tmp_path, edit_config=lambda c: c.update({field: value}))
    with pytest.raises(ValueError, match=message):
        load(path)


def test_missing_files_raise_file_not_found(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load(str(tmp_path))
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither"):
        load(str(tmp_path / "nope.bin"))


def test_tied_checkpoint_with_a_different_head_is_rejected():
    hf = random_hf_model(seed=11)
    tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    config = LlamaConfig.from_hf(
        json.loads(hf.config.to_json_string()) | {"tie_word_embeddings": True}
    )
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        hf_to_params(tensors, config)
