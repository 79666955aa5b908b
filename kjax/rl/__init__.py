"""RL training toward k-sample objectives: configs, losses, objective routing, the update, the loop.

Pure functions of explicit [B, N, T] arrays (B prompts, N samples, T completion tokens).
Advantages are in the sum convention throughout (see kjax.rl.objective). Configuration
types live in kjax.rl.config, a leaf module; so that importing it pulls in nothing else,
the names below load their module on first use.
"""

import importlib

_EXPORTS = {
    "kjax.rl.losses": (
        "KLEstimator",
        "LossAggregation",
        "aggregate_tokens",
        "cross_entropy_loss",
        "dco_loss",
        "entropy_loss",
        "kl_penalty_loss",
        "policy_gradient_loss",
        "ppo_clip_loss",
        "sequence_logprob",
        "token_entropy",
        "token_logprobs",
        "truncated_importance_weights",
    ),
    "kjax.rl.objective": (
        "KSchedule",
        "KScheduleKind",
        "Objective",
        "ObjectiveConfig",
        "compute_advantages",
    ),
    "kjax.rl.optim": ("OptimizerConfig", "make_optimizer", "make_schedule"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'kjax.rl' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
