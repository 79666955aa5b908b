"""transformers' PyTorch LlamaForCausalLM as the reference for tiny random configs."""

import json

import numpy as np
import torch
import transformers

from kjax.models import LlamaConfig, from_params
from kjax.models.weights import hf_to_params


def random_hf_model(seed: int = 0, std: float = 0.2, **overrides) -> transformers.LlamaForCausalLM:
    """A tiny LlamaForCausalLM with all weights (norms too) drawn N(0, std^2) + norms ~1.

    Large-ish weights make logits O(1) and every parameter matter, so a wrong layout or
    a missing term shows up far above the 1e-5 tolerance.
    """
    return random_family_model("llama", seed, std, **overrides)


FAMILY_CLASSES = {  # model_type -> (config class, causal LM class)
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def random_family_model(family: str, seed: int = 0, std: float = 0.2, **overrides):
    """A tiny random model of any family transformers builds from its own config class
    (`random_hf_model` is its Llama): every weight N(0, std^2), norms (the q/k norms too)
    ~1, biases included."""
    kwargs = dict(
        vocab_size=11,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    kwargs.update(overrides)
    config_cls, model_cls = FAMILY_CLASSES[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + std * torch.randn_like(p))
    return model


def kjax_from_hf(model: transformers.LlamaForCausalLM, **kwargs):
    """The same weights as a kjax Llama, through the strict name map."""
    config = LlamaConfig.from_hf(json.loads(model.config.to_json_string()))  # = config.json
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return from_params(config, hf_to_params(tensors, config), **kwargs)


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Reference logits [B,S,V]; positions count real tokens, as kjax's default."""
    if mask is None:
        mask = np.ones_like(tokens)
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()
