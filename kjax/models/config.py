"""LlamaConfig: the hyperparameters of kjax's decoder, to and from a HF config.json.

One decoder core (models/llama.py) serves every family; a family is a set of config
fields: Llama 2/3.x and SmolLM2 (the base), Qwen2/Qwen2.5 (q/k/v biases, optional
sliding-window layers), Qwen3 dense (per-head RMSNorm on q and k) and Mistral (a sliding
window on every layer). Parsing is strict: a field the family does not implement raises
ValueError naming it, so a checkpoint is never silently run with the wrong math.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from kjax.attention_backend import AttentionBackend

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


class Family(enum.Enum):
    """A transformers architecture kjax implements (its config.json `model_type`)."""

    LLAMA = "llama"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"
    MISTRAL = "mistral"


_NAMES = {
    Family.LLAMA: "Llama",
    Family.QWEN2: "Qwen2",
    Family.QWEN3: "Qwen3",
    Family.MISTRAL: "Mistral",
}
_FAMILIES = ", ".join(f.value for f in Family)
_COMMON_FIELDS = frozenset(
    {
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
)
_QWEN_WINDOW = frozenset(
    {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}
)
# Per family: fields read beyond the common ones, and fields whose only supported value is
# the one given (anything else changes the math).
_KNOWN = {
    Family.LLAMA: _COMMON_FIELDS,
    Family.QWEN2: _COMMON_FIELDS | _QWEN_WINDOW,
    Family.QWEN3: _COMMON_FIELDS | _QWEN_WINDOW,
    Family.MISTRAL: _COMMON_FIELDS | {"sliding_window"},
}
_FIXED = {
    Family.LLAMA: {
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_interleaved": False,
    },
    Family.QWEN2: {"hidden_act": "silu", "use_mrope": False},
    Family.QWEN3: {"hidden_act": "silu", "attention_bias": False},
    Family.MISTRAL: {"hidden_act": "silu"},
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
    """Hyperparameters of one model of the decoder core (any family).

    `num_kv_heads` < `num_heads` is GQA (1 is MQA); `head_dim` may differ from
    `hidden_size // num_heads` (it does in some Llama 3.2 variants and in Qwen3).
    The family fixes the architecture's extras (properties `qkv_bias`: Qwen2, `qk_norm`:
    Qwen3). `sliding_window` W: a query attends only keys fewer than W positions back, on
    the layers `sliding_layers` marks ([L] bools; every layer when left empty); None: no
    window. `attention` picks the attention backend (AttentionBackend; a run setting, not
    the model's math, so from_hf/to_hf leave it out).
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
    family: Family = Family.LLAMA
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    attention: AttentionBackend = AttentionBackend.AUTO

    def __post_init__(self):
        try:
            object.__setattr__(self, "attention", AttentionBackend(self.attention))
        except ValueError:
            names = ", ".join(b.value for b in AttentionBackend)
            raise ValueError(f"attention={self.attention!r} must be one of {names}") from None
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention)"
            )
        object.__setattr__(self, "family", Family(self.family))
        layers = self.sliding_layers
        if self.sliding_window is None:
            if any(layers):
                raise ValueError("sliding_layers marks layers but sliding_window is None")
            return
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be >= 1 (or None)")
        if layers and len(layers) != self.num_layers:
            raise ValueError(
                f"sliding_layers has {len(layers)} entries, num_layers={self.num_layers}"
            )
        if self.family is Family.LLAMA:
            raise ValueError("a sliding window is not part of family llama; use mistral")
        if self.family is Family.MISTRAL and not all(layers):
            raise ValueError("Mistral's window covers every layer; use qwen2/qwen3 for a mix")

    @property
    def qkv_bias(self) -> bool:
        """q/k/v projections with biases (Qwen2)."""
        return self.family is Family.QWEN2

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm of q and k before RoPE (Qwen3)."""
        return self.family is Family.QWEN3

    @property
    def window_layers(self) -> tuple[bool, ...]:
        """[L] True where the sliding window applies (all layers when sliding_layers is
        empty and a window is set; none without a window)."""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        return tuple(self.sliding_layers) or (True,) * self.num_layers

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> LlamaConfig:
        """Builds a config from a transformers `config.json` dict (v4 or v5 RoPE fields).

        The family is its `model_type` (llama when absent); fields that family does not
        implement, and values of fixed fields other than the one kjax implements, raise
        ValueError naming the field.
        """
        model_type = hf.get("model_type") or "llama"
        try:
            family = Family(model_type)
        except ValueError:
            raise ValueError(
                f"config.json model_type={model_type!r} (architectures "
                f"{hf.get('architectures')}) is not supported: kjax implements the families "
                f"{_FAMILIES}"
            ) from None
        name, fixed, known = _NAMES[family], _FIXED[family], _KNOWN[family]
        for key, value in hf.items():
            if key == "model_type" or key in _IGNORED_FIELDS:
                continue
            if key in fixed:
                if value != fixed[key] and value is not None:
                    raise ValueError(
                        f"config.json field {key!r}={value!r} is not supported "
                        f"(kjax's {name} implements only {key}={fixed[key]!r})"
                    )
            elif key not in known:
                others = [f.value for f in Family if key in _KNOWN[f] or key in _FIXED[f]]
                if others:
                    where = f"(families with it: {', '.join(others)})"
                else:
                    where = f"(no family kjax implements has it: {_FAMILIES})"
                raise ValueError(
                    f"unknown config.json field {key!r}: kjax's {name} does not implement it "
                    f"{where}; remove it if it does not change the model's math"
                )
        # transformers v5 folds rope_theta and the scaling into `rope_parameters`.
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        scaling = _parse_rope(rope)
        num_heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id", 2)
        window, sliding = _parse_window(hf, family)
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
            family=family,
            sliding_window=window,
            sliding_layers=sliding,
        )

    def to_hf(self) -> dict[str, Any]:
        """The transformers v5 `config.json` dict of this config (its family's CausalLM)."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope = {"rope_type": "llama3", "rope_theta": self.rope_theta}
            rope.update(dataclasses.asdict(self.rope_scaling))
        eos = list(self.eos_ids)
        out = {
            "architectures": [f"{_NAMES[self.family]}ForCausalLM"],
            "model_type": self.family.value,
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
        }
        if self.family is Family.LLAMA:
            out |= {"attention_bias": False, "mlp_bias": False}
        elif self.family is Family.MISTRAL:
            out["sliding_window"] = self.sliding_window
        else:
            slides = self.window_layers
            out |= {
                "use_sliding_window": self.sliding_window is not None,
                "sliding_window": self.sliding_window,
                "max_window_layers": slides.index(True) if any(slides) else self.num_layers,
                "layer_types": [_LAYER_TYPES[s] for s in slides],
            }
            if self.family is Family.QWEN3:
                out["attention_bias"] = False
        return out


_LAYER_TYPES = {False: "full_attention", True: "sliding_attention"}


def _parse_window(hf: Mapping[str, Any], family: Family) -> tuple[int | None, tuple[bool, ...]]:
    """(sliding_window, sliding_layers) as transformers builds them for the family.

    Mistral: the window (when not null) on every layer. Qwen2/Qwen3: the window only when
    use_sliding_window is true, on the layers `layer_types` calls "sliding_attention"
    (transformers v5), else on layers i >= max_window_layers (its default, 28).
    """
    L = hf["num_hidden_layers"]
    window = hf.get("sliding_window")
    if family is Family.MISTRAL:
        return window, ()
    if family is Family.LLAMA or not hf.get("use_sliding_window", False) or window is None:
        return None, ()
    types = hf.get("layer_types")
    if types is None:
        first = hf.get("max_window_layers", 28)
        return window, tuple(i >= first for i in range(L))
    bad = sorted({t for t in types if t not in _LAYER_TYPES.values()})
    if bad or len(types) != L:
        raise ValueError(
            f"config.json layer_types must list num_hidden_layers={L} entries of "
            f"{sorted(_LAYER_TYPES.values())}; got {len(types)} entries, unsupported {bad}"
        )
    return window, tuple(t == _LAYER_TYPES[True] for t in types)


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
