"""The optimizer: optax AdamW with linear warmup + cosine decay and global-norm clipping."""

from __future__ import annotations

import dataclasses
import numbers

import jax
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW (Loshchilov & Hutter 2019) hyperparameters; validated on construction.

    The learning rate rises linearly from 0 to `learning_rate` over `warmup_steps`, then
    follows a cosine down to `learning_rate * end_lr_ratio` at `total_steps` (counted from
    step 0, warmup included) and stays there.
    """

    learning_rate: float = 1e-6
    warmup_steps: int = 0
    total_steps: int = 1000
    end_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decay_vectors: bool = False  # also decay rank < 2 params (norm scales, biases)?
    max_grad_norm: float | None = 1.0  # None: no clipping

    def __post_init__(self):
        def bad(field, want):
            value = getattr(self, field)
            return ValueError(f"`OptimizerConfig.{field}` must be {want}; got {value!r}.")

        def real(field):
            value = getattr(self, field)
            return isinstance(value, numbers.Real) and not isinstance(value, bool)

        def integer(field):
            value = getattr(self, field)
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        if not (real("learning_rate") and self.learning_rate > 0):
            raise bad("learning_rate", "a float > 0")
        if not (integer("warmup_steps") and self.warmup_steps >= 0):
            raise bad("warmup_steps", "an int >= 0")
        if not (integer("total_steps") and self.total_steps > self.warmup_steps):
            raise bad("total_steps", f"an int > warmup_steps={self.warmup_steps}")
        if not (real("end_lr_ratio") and 0 <= self.end_lr_ratio <= 1):
            raise bad("end_lr_ratio", "a float in [0, 1]")
        for field in ("b1", "b2"):
            if not (real(field) and 0 <= getattr(self, field) < 1):
                raise bad(field, "a float in [0, 1)")
        if not (real("eps") and self.eps > 0):
            raise bad("eps", "a float > 0")
        if not (real("weight_decay") and self.weight_decay >= 0):
            raise bad("weight_decay", "a float >= 0")
        if not isinstance(self.decay_vectors, bool):
            raise bad("decay_vectors", "a bool")
        if self.max_grad_norm is not None and not (
            real("max_grad_norm") and self.max_grad_norm > 0
        ):
            raise bad("max_grad_norm", "a float > 0 or None")


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """step -> learning rate: linear warmup from 0, then cosine to lr * end_lr_ratio."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps,
        end_value=cfg.learning_rate * cfg.end_lr_ratio,
    )


def _decay_mask(params):
    # Decaying RMSNorm scales pulls them to 0 and shrinks activations: matrices only.
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping (to cfg.max_grad_norm), then AdamW on the schedule above.

    Clipping comes first so that Adam's moments see the clipped gradients. Step t's update
    uses learning rate make_schedule(cfg)(t), t = 0 for the first update.
    """
    if not isinstance(cfg, OptimizerConfig):
        raise ValueError(f"`cfg` must be an OptimizerConfig; got {type(cfg).__name__}.")
    adamw = optax.adamw(
        learning_rate=make_schedule(cfg),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=None if cfg.decay_vectors else _decay_mask,
    )
    if cfg.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
