"""kjax's policy model: a Flax NNX Llama with HF safetensors/GGUF weights (see llama.py)."""

from kjax.models.config import Llama3RopeScaling, LlamaConfig
from kjax.models.fetch import pretrained
from kjax.models.llama import Llama, decode_step, forward, prefill
from kjax.models.weights import from_params, load, save_hf

__all__ = [
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
