"""The model and mesh groups of a run's config (TrainConfig.model, TrainConfig.mesh).

A leaf like kjax/rl/config.py, which re-exports these names: option vocabularies only.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from kjax._fields import IDENTITY_IF_SET, check_int, coerce_enums, need
from kjax.attention_backend import AttentionBackend
from kjax.lora_config import LoraConfig
from kjax.lora_config import coerce as coerce_lora

__all__ = ["DType", "MeshConfig", "ModelConfig", "ModelKind"]


class ModelKind(enum.Enum):
    TINY = "tiny"  # a random-init Llama of the sizes below, character tokenizer
    PRETRAINED = "pretrained"  # kjax.models.pretrained(name), its tokenizer + chat template
    HF_DIR = "hf_dir"  # a local HF directory (safetensors): Llama, Qwen2/2.5, Qwen3, Mistral


class DType(enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    kind: ModelKind = ModelKind.TINY
    name: str = "smollm2-135m-instruct"  # PRETRAINED
    path: str = ""  # HF_DIR
    hidden_size: int = 64  # TINY sizes
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 192
    dtype: DType = DType.FLOAT32  # compute dtype (sampler, train step, SFT)
    # The attention backend of the update and the sampler's prefill (kjax/models/
    # attention.py): AUTO is a kernel on TPU/GPU and the jnp reference on CPU.
    attention: AttentionBackend = dataclasses.field(
        default=AttentionBackend.AUTO, metadata=IDENTITY_IF_SET
    )
    # Low-rank adapters on the RL update (rank 0: full fine-tuning); kjax.models.lora.
    lora: LoraConfig = dataclasses.field(default=LoraConfig(), metadata=IDENTITY_IF_SET)

    def __post_init__(self):
        coerce_enums(self, "model.")
        object.__setattr__(self, "lora", coerce_lora(self.lora))
        for field in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
        ):
            check_int(getattr(self, field), f"config.model.{field}", 1)
        need(
            self.hidden_size % self.num_heads == 0,
            "model.hidden_size",
            f"must be a multiple of model.num_heads={self.num_heads}",
            self.hidden_size,
        )
        need(
            self.num_heads % self.num_kv_heads == 0,
            "model.num_kv_heads",
            f"must divide model.num_heads={self.num_heads}",
            self.num_kv_heads,
        )

    @property
    def compute_dtype(self):
        """The one dtype resolution (a jnp dtype) used by the model, sampler and updates."""
        import jax.numpy as jnp

        return jnp.dtype(self.dtype.value)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes of the training mesh; one may be -1 (the remaining devices).

    sampler_devices: 0 (the sampler runs on the training mesh), or the number of devices
      (the first ones) of a separate sampling group, data-parallel, which samples step
      t + rl.policy_lag's rollouts while the other devices run step t's update; the
      training mesh is then made of the remaining devices.
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    sampler_devices: int = 0

    def __post_init__(self):
        sizes = [self.data, self.fsdp, self.tensor]
        need(
            all(isinstance(s, int) and (s >= 1 or s == -1) for s in sizes) and sizes.count(-1) <= 1,
            "mesh",
            "sizes must be >= 1 with at most one -1",
            sizes,
        )
        check_int(self.sampler_devices, "config.mesh.sampler_devices", 0)

    def training_devices(self, devices: int) -> int:
        """Devices of the training mesh out of `devices` in all."""
        need(
            self.sampler_devices < devices,
            "mesh.sampler_devices",
            f"must leave devices to train on (there are {devices}); lower it, or set 0 to "
            "sample on the training mesh",
            self.sampler_devices,
        )
        return devices - self.sampler_devices

    def resolve(self, devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) with -1 filled in for `devices` (the training mesh's, after
        training_devices); the one mesh resolution."""
        sizes = [self.data, self.fsdp, self.tensor]
        known = math.prod(s for s in sizes if s != -1)
        need(devices % known == 0, "mesh", f"does not divide the {devices} devices", sizes)
        if -1 in sizes:
            sizes[sizes.index(-1)] = devices // known
        need(
            math.prod(sizes) == devices,
            "mesh",
            f"must use all {devices} devices (or set one size to -1)",
            sizes,
        )
        return tuple(sizes)

    def batch_devices(self, devices: int) -> int:
        """Devices B is sharded over (data x fsdp)."""
        data, fsdp, _ = self.resolve(devices)
        return data * fsdp
