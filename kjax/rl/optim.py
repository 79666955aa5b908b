"""The optimizer: optax AdamW with linear warmup + cosine decay and global-norm clipping."""

from __future__ import annotations

import jax
import optax

from kjax.rl.step_config import OptimizerConfig  # re-exported: the config lives there

__all__ = ["OptimizerConfig", "make_optimizer", "make_schedule"]


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
