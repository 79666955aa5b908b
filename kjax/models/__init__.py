"""kjax's policy model: one Flax NNX decoder core (llama.py) whose families (Llama, Qwen2,
Qwen3, Mistral) are config fields (config.py), with HF safetensors/GGUF weights."""

from kjax.models.config import Family, Llama3RopeScaling, LlamaConfig
from kjax.models.fetch import pretrained
from kjax.models.llama import Llama, decode_step, forward, prefill
from kjax.models.weights import from_params, load, save_hf

__all__ = [
    "Family",
    "Llama",
    "Llama3RopeScaling",
    "LlamaConfig",
    "decode_step",
    "forward",
    "from_params",
    "load",
    "prefill",
    "pretrained",
    "save_hf",
]
