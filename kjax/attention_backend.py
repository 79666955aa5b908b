"""The attention backend option, shared by the model config (kjax/models/config.py) and the
run config (kjax/rl/config.py): a leaf module, so the run config does not import the model."""

import enum


class AttentionBackend(enum.Enum):
    """How attention is computed (kjax/models/attention.py; docs/models.md).

    AUTO: by the platform traced for (the TPU splash kernel; the jnp reference elsewhere,
    GPUs included until the cuDNN call is compiled for one, and wherever a kernel does
    not apply). JNP: the reference, what
    CPU runs. SPLASH: Pallas splash attention (TPU; interpreted elsewhere, for tests).
    CUDNN: `jax.nn.dot_product_attention(implementation="cudnn")` (GPU, bf16/fp16; its
    XLA implementation elsewhere, for tests). Not part of a checkpoint's config.json.
    """

    AUTO = "auto"
    JNP = "jnp"
    SPLASH = "splash"
    CUDNN = "cudnn"
