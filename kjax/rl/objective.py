"""The training objective: which k-sample objective, its advantage estimator, and k's schedule.

`compute_advantages` routes to kjax.objectives and returns every objective in ONE scale,
the sum convention: per prompt, sum_i A_i grad log pi(y_i) estimates grad J (no 1/N), so
learning rates transfer between objectives and a k-annealing step (8 -> 1) keeps its scale.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers

import jax
import jax.numpy as jnp

from kjax import objectives
from kjax.objectives import MaxAtKEstimator, MeanBaseline


class Objective(enum.Enum):
    """What J is: E[r] (MEAN), E[max of k rewards] (MAX_AT_K; pass@k on {0,1}), maj@k."""

    MEAN = "mean"
    MAX_AT_K = "max_at_k"
    MAJORITY_AT_K = "majority_at_k"


class KScheduleKind(enum.Enum):
    CONSTANT = "constant"  # k_start forever
    LINEAR = "linear"  # round(k_start + (k_end - k_start) * step / steps), then k_end
    STEP = "step"  # k_start for step < steps, then k_end (PKPO's k-annealing, e.g. 8 -> 1)


def coerce_enum(value, enum_cls: type[enum.Enum], field: str):
    """Returns `value` as an `enum_cls` member; accepts the member, its value or its name
    (so config flags can say `--config.objective=max_at_k`); raises naming `field`."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        for member in enum_cls:
            if value.lower() in (member.value.lower(), member.name.lower()):
                return member
    choices = ", ".join(m.name for m in enum_cls)
    raise ValueError(f"`{field}` must be one of {enum_cls.__name__} {{{choices}}}; got {value!r}.")


def _check_int(value, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{field}` must be an int >= {minimum}; got {value!r}.")
    return int(value)


@dataclasses.dataclass(frozen=True)
class KSchedule:
    """k as a function of the training step; every value is a static Python int.

    k is a static argument of the advantage functions (it sets constant weight tables, not
    array shapes), so each distinct k compiles them once: a LINEAR 8 -> 1 anneal compiles
    up to 8 versions. The jitted train step takes advantages as arrays and never sees k.
    """

    kind: KScheduleKind = KScheduleKind.CONSTANT
    k_start: int = 1
    k_end: int | None = None  # None: k_start
    steps: int = 0  # anneal length for LINEAR; switch step for STEP

    def __post_init__(self):
        object.__setattr__(self, "kind", coerce_enum(self.kind, KScheduleKind, "KSchedule.kind"))
        object.__setattr__(self, "k_start", _check_int(self.k_start, "KSchedule.k_start", 1))
        k_end = self.k_start if self.k_end is None else self.k_end
        object.__setattr__(self, "k_end", _check_int(k_end, "KSchedule.k_end", 1))
        min_steps = 0 if self.kind is KScheduleKind.CONSTANT else 1
        object.__setattr__(self, "steps", _check_int(self.steps, "KSchedule.steps", min_steps))
        if self.kind is KScheduleKind.CONSTANT and self.k_end != self.k_start:
            raise ValueError(
                f"`KSchedule.k_end`={self.k_end} differs from k_start={self.k_start} but kind "
                "is CONSTANT; use LINEAR or STEP to anneal."
            )

    def __call__(self, step: int) -> int:
        step = _check_int(step, "step", 0)
        if self.kind is KScheduleKind.CONSTANT:
            return self.k_start
        if self.kind is KScheduleKind.STEP:
            return self.k_start if step < self.steps else self.k_end
        frac = min(step, self.steps) / self.steps
        return int(math.floor(self.k_start + (self.k_end - self.k_start) * frac + 0.5))

    def values(self) -> tuple[int, ...]:
        """The distinct k this schedule ever returns, ascending (one compile each)."""
        lo, hi = sorted((self.k_start, self.k_end))
        if self.kind is not KScheduleKind.LINEAR:
            return tuple(sorted({lo, hi}))
        if self.steps >= hi - lo:  # k moves by at most 1 per step: it visits all of [lo, hi]
            return tuple(range(lo, hi + 1))
        return tuple(sorted({self(s) for s in range(self.steps + 1)}))


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """The objective and its estimator; validated on construction (fields named in errors).

    k: the objective's k (1 for MEAN); a KSchedule may override it per step.
    mean_baseline: MEAN's baseline (RLOO unbiased; GROUP_MEAN Dr.GRPO; GROUP_ZSCORE GRPO).
    max_at_k_estimator: MAX_AT_K's estimator (LOO_MINUS_ONE recommended; see
      kjax.objectives.MaxAtKEstimator for which are biased).
    majority_centered: MAJORITY_AT_K subtracts the group mean (Tang et al.'s biased variant).
    offpolicy_clamp: c in Bagirov et al.'s off-policy max@k weights (delta in [-c, c]).
    """

    objective: Objective = Objective.MEAN
    k: int = 1
    mean_baseline: MeanBaseline = MeanBaseline.RLOO
    max_at_k_estimator: MaxAtKEstimator = MaxAtKEstimator.LOO_MINUS_ONE
    majority_centered: bool = False
    offpolicy_clamp: float = 0.2

    def __post_init__(self):
        for field, cls in (
            ("objective", Objective),
            ("mean_baseline", MeanBaseline),
            ("max_at_k_estimator", MaxAtKEstimator),
        ):
            value = coerce_enum(getattr(self, field), cls, f"ObjectiveConfig.{field}")
            object.__setattr__(self, field, value)
        object.__setattr__(self, "k", _check_int(self.k, "ObjectiveConfig.k", 1))
        if self.objective is Objective.MEAN and self.k != 1:
            raise ValueError(
                f"`ObjectiveConfig.k`={self.k} but objective is MEAN, the k = 1 objective; "
                "set k=1 or objective=MAX_AT_K / MAJORITY_AT_K."
            )
        if not isinstance(self.majority_centered, bool):
            raise ValueError(
                "`ObjectiveConfig.majority_centered` must be a bool; got "
                f"{self.majority_centered!r}."
            )
        clamp = self.offpolicy_clamp
        if isinstance(clamp, bool) or not isinstance(clamp, (int, float)) or not clamp > 0:
            raise ValueError(f"`ObjectiveConfig.offpolicy_clamp` must be > 0; got {clamp!r}.")

    def check_samples(self, n: int, schedule: KSchedule | None = None) -> None:
        """Raises before any compute if N samples per prompt cannot serve every k used."""
        n = _check_int(n, "N (samples per prompt)", 1)
        ks = (self.k,) if schedule is None else schedule.values()
        field = "ObjectiveConfig.k" if schedule is None else "KSchedule k_start/k_end"
        if self.objective is Objective.MEAN:
            if ks != (1,):
                raise ValueError(f"`{field}` must be 1 for objective MEAN; got k in {ks}.")
            if self.mean_baseline is MeanBaseline.RLOO and n < 2:
                raise ValueError("`ObjectiveConfig.mean_baseline`=RLOO needs N >= 2 samples.")
            return
        need = max(ks) + (self.max_at_k_estimator is MaxAtKEstimator.LOO)
        if self.objective is Objective.MAX_AT_K and n < need:
            raise ValueError(
                f"`{field}`: k={max(ks)} with {self.max_at_k_estimator.name} needs N >= {need} "
                f"samples per prompt; got N={n}. Lower k or sample more."
            )
        if max(ks) > n:
            raise ValueError(f"`{field}`: k={max(ks)} > N={n} samples per prompt.")


def compute_advantages(
    cfg: ObjectiveConfig,
    k: int | None,
    scores: jax.Array,
    answer_ids: jax.Array | None = None,
    target: jax.Array | None = None,
    log_ratio: jax.Array | None = None,
) -> jax.Array:
    """Per-sample advantages [B, N] in the sum convention, under stop_gradient.

    MEAN: mean_advantages(scores, baseline) / N (the peers' mean convention, rescaled).
    MAX_AT_K: max_at_k_advantages(scores, k, estimator) (pass@k for {0, 1} scores); with
      `log_ratio`, Bagirov et al.'s first-order off-policy weights instead (no baseline,
      whatever the estimator). These already contain sample i's importance ratio, so pair
      them with losses.policy_gradient_loss, not ppo_clip_loss, which would apply it twice.
    MAJORITY_AT_K: majority_at_k_advantages(answer_ids, target, k, centered).
    `log_ratio` is ignored for MEAN (PPO's ratio corrects it) and for MAJORITY_AT_K (no
    off-policy majority weights exist yet: reused rollouts are treated as on-policy).

    Args:
      cfg: ObjectiveConfig (hashable: pass it as a static argument under jit).
      k: static int for this step (from a KSchedule); None means cfg.k.
      scores: [B, N] float rewards.
      answer_ids: [B, N] int answer classes (-1 abstains); MAJORITY_AT_K only.
      target: [B] int correct class per prompt; MAJORITY_AT_K only.
      log_ratio: [B, N] float, stop-gradient log pi_theta(y) - log pi_rollout(y) summed over
        tokens (losses.sequence_logprob), when a rollout is reused for a later PPO epoch.

    Returns:
      [B, N] advantages in scores' float dtype.
    """
    if not isinstance(cfg, ObjectiveConfig):
        raise ValueError(f"`cfg` must be an ObjectiveConfig; got {type(cfg).__name__}.")
    k = cfg.k if k is None else k
    scores = jnp.asarray(scores)
    if scores.ndim != 2 or not jnp.issubdtype(scores.dtype, jnp.floating):
        raise ValueError(
            f"`scores` must be float [B, N]; got {scores.dtype} shape {tuple(scores.shape)}."
        )
    n = scores.shape[1]
    if cfg.objective is Objective.MEAN:
        if k != 1:
            raise ValueError(f"`k`={k} but the MEAN objective is k = 1.")
        return objectives.mean_advantages(scores, cfg.mean_baseline) / n
    if cfg.objective is Objective.MAX_AT_K:
        if log_ratio is None:
            return objectives.max_at_k_advantages(scores, k, cfg.max_at_k_estimator)
        return objectives.max_at_k_offpolicy_advantages(scores, log_ratio, k, cfg.offpolicy_clamp)
    if answer_ids is None or target is None:
        missing = "answer_ids" if answer_ids is None else "target"
        raise ValueError(f"`{missing}` is required for Objective.MAJORITY_AT_K.")
    answer_ids = jnp.asarray(answer_ids)
    if answer_ids.shape != scores.shape:
        raise ValueError(
            f"`answer_ids` must have the shape of `scores` {tuple(scores.shape)}; got "
            f"{tuple(answer_ids.shape)}."
        )
    adv = objectives.majority_at_k_advantages(answer_ids, target, k, cfg.majority_centered)
    return adv.astype(scores.dtype)
