"""The objective router: ObjectiveConfig -> kjax.objectives, in ONE scale for every objective.

The sum convention: per prompt, sum_i A_i grad log pi(y_i) estimates grad J (no 1/N), so
learning rates transfer between objectives and a k-annealing step (8 -> 1) keeps its scale.
Estimators that are normalised per sample (MEAN's baselines, Chen et al.'s pass@k
advantage, like GRPO's z-score) are divided by N to enter that scale. The configuration
types live in kjax.rl.objective_config (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from kjax import objectives
from kjax.objectives import MaxAtKEstimator
from kjax.objectives.bon_distill import bon_distill_advantages
from kjax.objectives.pseudo_label import majority_pseudo_rewards
from kjax.objectives.shrinkage import shrink_max_at_k_mixture_advantages
from kjax.rl.objective_config import (
    OFFPOLICY_ESTIMATORS,
    BonAnchor,
    KSchedule,
    KScheduleKind,
    Objective,
    ObjectiveConfig,
    RewardSource,
    lag_exact_problem,
    offpolicy_estimator_names,
)
from kjax.rl.step_config import LagCorrection, OffPolicyMaxAtK, StepConfig

__all__ = [
    "objective_ks",
    "objective_value",
    "KSchedule",
    "KScheduleKind",
    "Objective",
    "ObjectiveConfig",
    "RewardSource",
    "compute_advantages",
    "offpolicy_reweighter",
]


def compute_advantages(
    cfg: ObjectiveConfig,
    k: int | None,
    scores: jax.Array,
    answer_ids: jax.Array | None = None,
    target: jax.Array | None = None,
    anchor_scores: jax.Array | None = None,
) -> jax.Array:
    """Per-sample advantages [B, N] in the sum convention, under stop_gradient.

    With reward=MAJORITY_VOTE the scores are first replaced by TTRL's label-free rewards,
    majority_pseudo_rewards(answer_ids, min_agreement) (answer_ids required), and the
    objective below runs on them.

    MEAN: mean_advantages(scores, baseline) / N (the peers' mean convention, rescaled).
    MAXRL_PRACTICAL: maxrl_practical_advantages(scores) / N, likewise.
    MAX_AT_K: max_at_k_advantages(scores, k, estimator) (pass@k for {0, 1} scores), already
      in the sum convention, except CHEN_ANALYTIC, which is normalised per sample (at
      k = 1 it is GRPO's z-score) and so is divided by N, as MEAN is. With
      max_at_k_shrinkage: shrink_max_at_k_advantages(scores, k, estimator).
    MAJORITY_AT_K: majority_at_k_advantages(answer_ids, target, k, centered).
    MAX_AT_K_MIXTURE: max_at_k_mixture_advantages(scores, weights, estimator) for
      sum_k w_k max@k (weights from cfg.mixture_weights, or maxrl_weights(cfg.maxrl_t));
      with max_at_k_shrinkage, each k's baseline shrunk (shrink_max_at_k_mixture_advantages).
    BON_DISTILL: bon_distill_advantages(scores, n=k), already in the sum convention: the
      best-of-k transformed reward with the group's other samples as the anchor (the
      current policy, BOND's moving anchor) and a leave-two-out baseline. The KL half of
      the objective is the trainer's penalty to the warm start (rl.kl_coef > 0 with
      rl.kl_estimator=K2, whose gradient is that of KL(pi || ref)); with this moving
      anchor, coefficient k would make best-of-k of the warm start stationary only with
      exact CDFs on continuous rewards; with the group's N - 1 anchors and the CDF floor
      the stationary point lies well short of it (n = 8, N = 16: nearest best-of-3.3;
      docs/estimators.md section 8). With bon_anchor=REFERENCE (vBoN's objective):
      bon_distill_advantages(scores, k, anchor_rewards=anchor_scores), the anchors being
      M samples per prompt of the fixed reference (the loop draws them), an RLOO baseline;
      its expected update is exactly the gradient of E_pi[log(w_k / k)] under the anchors'
      empirical CDF, and with rl.kl_coef = 1 (K2) the objective's maximiser is the
      reference's best-of-k.

    Args:
      cfg: ObjectiveConfig (hashable: pass it as a static argument under jit).
      k: static int for this step (from a KSchedule); None means cfg.k. Unused by mixtures.
      scores: [B, N] float rewards.
      answer_ids: [B, N] int answer classes (-1 abstains); MAJORITY_AT_K only.
      target: [B] int correct class per prompt; MAJORITY_AT_K only.
      anchor_scores: [B, M] float rewards of the reference's samples of the same prompts;
        BON_DISTILL with bon_anchor=REFERENCE only (required there, refused elsewhere).

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
    reference = cfg.bon_anchor is BonAnchor.REFERENCE
    if reference and anchor_scores is None:
        raise ValueError(
            "`anchor_scores` [B, M] (the fixed reference's samples' rewards) is required for "
            "BON_DISTILL with bon_anchor=REFERENCE."
        )
    if anchor_scores is not None and not reference:
        raise ValueError(
            "`anchor_scores` is only read by BON_DISTILL with bon_anchor=REFERENCE; got "
            f"objective {cfg.objective.name}, bon_anchor {cfg.bon_anchor.name}."
        )
    if cfg.reward is RewardSource.MAJORITY_VOTE:
        if answer_ids is None:
            raise ValueError("`answer_ids` is required for reward=MAJORITY_VOTE.")
        answer_ids = _check_answers(answer_ids, scores)
        scores = majority_pseudo_rewards(answer_ids, cfg.min_agreement, scores.dtype)
    if cfg.objective in (Objective.MEAN, Objective.MAXRL_PRACTICAL):
        if k != 1:
            raise ValueError(f"`k`={k} but the {cfg.objective.name} objective is k = 1.")
        if cfg.objective is Objective.MAXRL_PRACTICAL:
            return objectives.maxrl_practical_advantages(scores) / n
        return objectives.mean_advantages(scores, cfg.mean_baseline) / n
    if cfg.objective is Objective.MAX_AT_K and cfg.max_at_k_shrinkage:
        return objectives.shrink_max_at_k_advantages(scores, k, cfg.max_at_k_estimator)
    if cfg.objective is Objective.MAX_AT_K:
        adv = objectives.max_at_k_advantages(scores, k, cfg.max_at_k_estimator)
        if cfg.max_at_k_estimator is MaxAtKEstimator.CHEN_ANALYTIC:
            return adv / n
        return adv
    if cfg.objective is Objective.BON_DISTILL:
        if reference:
            anchors = jnp.asarray(anchor_scores).astype(scores.dtype)
            return bon_distill_advantages(scores, k, anchor_rewards=anchors)
        return bon_distill_advantages(scores, k)
    if cfg.objective is Objective.MAX_AT_K_MIXTURE:
        weights = (
            objectives.maxrl_weights(cfg.maxrl_t) if cfg.maxrl_t else dict(cfg.mixture_weights)
        )
        if cfg.max_at_k_shrinkage:
            return shrink_max_at_k_mixture_advantages(scores, weights, cfg.max_at_k_estimator)
        return objectives.max_at_k_mixture_advantages(
            scores, weights, estimator=cfg.max_at_k_estimator
        )
    if answer_ids is None or target is None:
        missing = "answer_ids" if answer_ids is None else "target"
        raise ValueError(f"`{missing}` is required for Objective.MAJORITY_AT_K.")
    answer_ids = _check_answers(answer_ids, scores)
    adv = objectives.majority_at_k_advantages(answer_ids, target, k, cfg.majority_centered)
    return adv.astype(scores.dtype)


def _check_answers(answer_ids, scores: jax.Array) -> jax.Array:
    answer_ids = jnp.asarray(answer_ids)
    if answer_ids.shape != scores.shape:
        raise ValueError(
            f"`answer_ids` must have the shape of `scores` {tuple(scores.shape)}; got "
            f"{tuple(answer_ids.shape)}."
        )
    return answer_ids


Reweight = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def offpolicy_reweighter(
    cfg: ObjectiveConfig, step: StepConfig, ks: Sequence[int]
) -> Reweight | None:
    """The function the train step calls for updates after a step's first (for every
    update under rl.lag_correction=EXACT), or None (OFF; EXACT for MEAN, whose advantages
    stay the batch's and only the sequence ratio corrects them).

    reweight(scores [B,N], log_ratio [B,N], k [] int32) -> [B,N]: Bagirov et al.'s
    advantages that multiply sample i's own ratio (docs/estimators.md section 4), with
    log_ratio = log pi_theta(y) - log pi_start(y) per sequence (pi_start: the behaviour
    policy mu of a stale rollout under rl.lag_correction=EXACT). k is traced: every k in
    `ks` (the run's k values, e.g. KSchedule.values()) is compiled once as a branch of
    lax.switch, so a k schedule never retraces the update.
    """
    estimator = cfg.max_at_k_estimator
    if step.lag_correction is LagCorrection.EXACT:
        problem = lag_exact_problem(cfg)
        if problem is not None:
            raise ValueError(f"`rl.lag_correction`=EXACT: {problem}.")
        if cfg.objective is Objective.MEAN:
            return None  # the baseline is independent of y_i: the sequence ratio suffices
        exact = True
    elif step.offpolicy_max_at_k is OffPolicyMaxAtK.OFF:
        return None
    elif cfg.objective is not Objective.MAX_AT_K or estimator not in OFFPOLICY_ESTIMATORS:
        raise ValueError(
            f"`rl.offpolicy_max_at_k` needs objective MAX_AT_K with estimator "
            f"{offpolicy_estimator_names()}; got {cfg.objective.name} / {estimator.name}."
        )
    else:
        exact = step.offpolicy_max_at_k is OffPolicyMaxAtK.EXACT
    ks = tuple(sorted(set(ks)))

    def branch(k):
        return lambda scores, log_ratio: objectives.max_at_k_offpolicy_advantages(
            scores, log_ratio, k, estimator=estimator, exact=exact, clamp=step.offpolicy_clamp
        )

    branches = [branch(k) for k in ks]

    def reweight(scores, log_ratio, k):
        if len(branches) == 1:
            return branches[0](scores, log_ratio)
        index = jnp.argmax(jnp.asarray(ks) == k)  # k is one of ks (the schedule's values)
        return jax.lax.switch(index, branches, scores, log_ratio)

    return reweight


def _weights(cfg: ObjectiveConfig, k: int) -> dict[int, float]:
    """{k: weight} of the max@k terms the objective sums (MEAN: max@1; MAJORITY: maj@k;
    BON_DISTILL: max@1, the quality of one sample, which distillation raises toward the
    warm start's best-of-k)."""
    if cfg.objective is Objective.MAX_AT_K_MIXTURE:
        return objectives.maxrl_weights(cfg.maxrl_t) if cfg.maxrl_t else dict(cfg.mixture_weights)
    one = cfg.objective in (Objective.MEAN, Objective.BON_DISTILL, Objective.MAXRL_PRACTICAL)
    return {1 if one else k: 1.0}


def objective_ks(cfg: ObjectiveConfig, k: int | None = None) -> tuple[int, ...]:
    """The k values objective_value needs samples for (its N must be at least the largest)."""
    return tuple(sorted(_weights(cfg, cfg.k if k is None else k)))


def objective_value(cfg: ObjectiveConfig, k: int | None, scores, answer_ids=None, target=None):
    """The held-out value of the objective cfg trains for, a float: the mean over problems
    of kjax's unbiased estimate from the N samples of each (scores [B, N]; answer_ids
    [B, N] and target [B] for MAJORITY_AT_K). MEAN: the mean reward (max@1); MAX_AT_K: max@k
    (pass@k on binary rewards); MAJORITY_AT_K: maj@k; MAX_AT_K_MIXTURE: sum_k w_k max@k;
    MAXRL_PRACTICAL: the mean reward (its target, MaxRL's J_{N-1}, depends on the training
    N); BON_DISTILL: the mean reward (its own E[R] measures nothing against a moving anchor:
    with continuous rewards, E[(k - 1) log F(r)] = -(k - 1) for any policy whose own CDF
    is F).
    k: the k to score at (None: cfg.k). Raises when N cannot serve a k of the objective.
    """
    scores = jnp.asarray(scores)
    weights = _weights(cfg, cfg.k if k is None else k)
    n = scores.shape[1]
    if max(weights) > n:
        raise ValueError(
            f"the {cfg.objective.name} objective needs k <= N samples per problem; k = "
            f"{max(weights)} > N = {n}. Raise eval.n_eval."
        )
    if cfg.objective is Objective.MAJORITY_AT_K:
        (kk,) = weights
        return float(jnp.mean(objectives.majority_at_k(jnp.asarray(answer_ids), target, kk)))
    return float(sum(w * jnp.mean(objectives.max_at_k(scores, j)) for j, w in weights.items()))
