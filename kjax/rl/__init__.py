"""RL training toward k-sample objectives: configs, losses, objective routing, the update, the loop.

Pure functions of explicit [B, N, T] arrays (B prompts, N samples, T completion tokens).
Advantages are in the sum convention throughout (see kjax.rl.objective). Configuration
types: kjax.rl.config (a leaf module).
"""

from kjax.rl.losses import (
    KLEstimator,
    LossAggregation,
    aggregate_tokens,
    cross_entropy_loss,
    dco_loss,
    entropy_loss,
    kl_penalty_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    sequence_logprob,
    token_entropy,
    token_logprobs,
    truncated_importance_weights,
)
from kjax.rl.objective import (
    KSchedule,
    KScheduleKind,
    Objective,
    ObjectiveConfig,
    compute_advantages,
)
from kjax.rl.optim import OptimizerConfig, make_optimizer, make_schedule

__all__ = [
    "KLEstimator",
    "KSchedule",
    "KScheduleKind",
    "LossAggregation",
    "Objective",
    "ObjectiveConfig",
    "OptimizerConfig",
    "aggregate_tokens",
    "compute_advantages",
    "cross_entropy_loss",
    "dco_loss",
    "entropy_loss",
    "kl_penalty_loss",
    "make_optimizer",
    "make_schedule",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "sequence_logprob",
    "token_entropy",
    "token_logprobs",
    "truncated_importance_weights",
]
