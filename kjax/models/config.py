"""LlamaConfig: the Llama 2/3.x and SmolLM2 hyperparameters, to and from a HF config.json.

Parsing is strict: a field this model does not implement raises ValueError naming it,
so a checkpoint is never silently run with the wrong math.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# config.json fields that do not change the forward math (bookkeeping, training-only).
_IGNORED_FIELDS = frozenset(
    {
        "architectures",
        "attention_dropout",
        "initializer_range",
        "pretraining_tp",  # a tensor-parallel *training* trick; inference math is identical
        "use_cache",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "pad_token_id",
        "_name_or_path",
        "is_llama_config",  # SmolLM2 (nanotron export) marker
        "transformers.js_config",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
)
# Fields whose only supported value is the one given (anything else changes the math).
_FIXED_FIELDS = {
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "rope_interleaved": False,
}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """RoPE frequency scaling of Llama 3.1+ (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters of one Llama-architecture model.

    `num_kv_heads` < `num_heads` is GQA (1 is MQA); `head_dim` may differ from
    `hidden_size // num_heads` (it does in some Llama 3.2 variants).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    bos_id: int | None = 1
    eos_ids: tuple[int, ...] = (2,)
    max_position_embeddings: int = 2048

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention)"
            )

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> LlamaConfig:
        """Builds a config from a transformers `config.json` dict (v4 or v5 RoPE fields)."""
        known = {
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "rms_norm_eps",
            "tie_word_embeddings",
            "bos_token_id",
            "eos_token_id",
            "max_position_embeddings",
        }
        for key, value in hf.items():
            if key in _FIXED_FIELDS:
                if value != _FIXED_FIELDS[key] and value is not None:
                    raise ValueError(
                        f"config.json field {key!r}={value!r} is not supported "
                        f"(kjax's Llama implements only {key}={_FIXED_FIELDS[key]!r})"
                    )
            elif key not in known and key not in _IGNORED_FIELDS:
                raise ValueError(
                    f"unknown config.json field {key!r}: kjax's Llama does not implement it; "
                    "remove it if it does not change the model's math"
                )
        # transformers v5 folds rope_theta and the scaling into `rope_parameters`.
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        scaling = _parse_rope(rope)
        num_heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id", 2)
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_id=hf.get("bos_token_id", 1),
            eos_ids=tuple(eos)
            if isinstance(eos, list | tuple)
            else (() if eos is None else (eos,)),
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
        )

    def to_hf(self) -> dict[str, Any]:
        """The transformers v5 `config.json` dict of this config (LlamaForCausalLM)."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope = {"rope_type": "llama3", "rope_theta": self.rope_theta}
            rope.update(dataclasses.asdict(self.rope_scaling))
        eos = list(self.eos_ids)
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_parameters": rope,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
        }


def _parse_rope(rope: dict[str, Any]) -> Llama3RopeScaling | None:
    kind = rope.pop("rope_type", rope.pop("type", "default"))
    if kind == "default":
        if rope:
            raise ValueError(f"rope fields {sorted(rope)} are not used by rope_type 'default'")
        return None
    if kind != "llama3":
        raise ValueError(
            f"rope_scaling/rope_parameters field rope_type={kind!r} is not supported "
            "(kjax implements 'default' and 'llama3')"
        )
    missing = [k for k in _LLAMA3_KEYS if k not in rope]
    extra = sorted(set(rope) - set(_LLAMA3_KEYS))
    if missing or extra:
        raise ValueError(
            f"llama3 rope_scaling: missing fields {missing}, unsupported fields {extra}"
        )
    return Llama3RopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )
