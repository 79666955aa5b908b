"""The sampler's weight layout option, shared by the run config (kjax/rl/config.py) and
the sampler (kjax/sampling.py): a leaf module, so the run config does not import jax."""

import enum


class SamplerWeights(enum.Enum):
    """Where the sampler's weights live during a rollout (kjax.sampling.sampler_params;
    docs/scale.md, "The decode step's floor").

    TRAIN: the trainer's layout (sharding.RULES: fsdp x tensor), as the update holds them;
    every decode step then all-gathers each layer's weights over fsdp (the 8B decode on
    v6e-64: 1.6 GB over the interconnect per step, per chip). TENSOR: resharded once per
    rollout to tensor only (replicated over data and fsdp; Tunix and MaxText inference
    hold rollout weights in their own layout too): each chip holds and reads its tensor
    shard, nothing is gathered per step; it costs one all-gather over fsdp per rollout and
    the weights / tensor bytes beside the KV cache. AUTO: TENSOR where fsdp > 1 and that
    fits the device's memory (kjax.sampling.resolve_weights), else TRAIN; on one device,
    and on CPUs (no memory figure), TRAIN. The two are the same program where fsdp is 1.
    """

    AUTO = "auto"
    TRAIN = "train"
    TENSOR = "tensor"
