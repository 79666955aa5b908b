"""The training objective's configuration: which k-sample objective, its estimator, k's schedule.

A leaf module (option enums only); kjax.rl.objective routes it to kjax.objectives.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping

from kjax._fields import IDENTITY_IF_SET, check_int, coerce_enum, is_real
from kjax.objectives.advantages import MaxAtKEstimator, MeanBaseline
from kjax.objectives.shrinkage import SHRINKABLE


class Objective(enum.Enum):
    """What J is: E[r] (MEAN), E[max of k rewards] (MAX_AT_K; pass@k on {0,1}), maj@k,
    sum_k w_k max@k (MAX_AT_K_MIXTURE; MaxRL's truncated likelihood with w_k = 1/k), or
    best-of-k distillation (BON_DISTILL: E[log(w_k / k)] of the best-of-k weight against
    the group's other samples (BOND's moving anchor) or, with bon_anchor=REFERENCE,
    against samples of the fixed reference (vBoN); its KL half is rl.kl_coef, see
    docs/estimators.md section 8)."""

    MEAN = "mean"
    MAX_AT_K = "max_at_k"
    MAJORITY_AT_K = "majority_at_k"
    MAX_AT_K_MIXTURE = "max_at_k_mixture"
    BON_DISTILL = "bon_distill"
    # MaxRL's per-group form of SkyRL and prime-rl, (r_i - mean r) / mean r (rewards >= 0):
    # on binary rewards unbiased for the truncated mixture at T = N - 1 (docs/estimators.md
    # section 2.12); k = 1.
    MAXRL_PRACTICAL = "maxrl_practical"


class RewardSource(enum.Enum):
    """Where the objective's rewards come from.

    VERIFIER: the task's verifier against the reference answer (the default).
    MAJORITY_VOTE: label-free (TTRL, Zuo et al. 2025): 1/m for a sample whose answer class
      is one of the m classes with the most votes in its group, else 0
      (kjax.objectives.pseudo_label; docs/estimators.md section 6). Held-out metrics still
      use the verifier.
    """

    VERIFIER = "verifier"
    MAJORITY_VOTE = "majority_vote"


class BonAnchor(enum.Enum):
    """Whose best-of-k BON_DISTILL distils (docs/estimators.md section 8).

    GROUP: the group's other N - 1 samples, i.e. the current policy (BOND's moving anchor,
      refreshed every step; kjax's default, without BOND's Jeffreys divergence).
    REFERENCE: ObjectiveConfig.bon_anchor_samples = M fresh samples per prompt from the
      fixed KL reference (the warm start, rl.kl_coef > 0), scored by the task's verifier:
      vBoN's objective, E_pi[log(w_k / k)] - KL(pi || pi_ref), whose maximiser at
      rl.kl_coef = 1 is the best-of-k distribution of the reference (of its empirical
      CDF from the M anchors).
    """

    GROUP = "group"
    REFERENCE = "reference"


class KScheduleKind(enum.Enum):
    CONSTANT = "constant"  # k_start forever
    LINEAR = "linear"  # round(k_start + (k_end - k_start) * step / steps), then k_end
    STEP = "step"  # k_start for step < steps, then k_end (PKPO's k-annealing, e.g. 8 -> 1)


@dataclasses.dataclass(frozen=True)
class KSchedule:
    """k as a function of the training step; every value is a Python int.

    The advantage functions take k statically (it sets constant weight tables), so each
    distinct k compiles them once: a LINEAR 8 -> 1 anneal compiles up to 8 versions. The
    jitted update takes k as a traced scalar and never recompiles for it.
    """

    kind: KScheduleKind = KScheduleKind.CONSTANT
    k_start: int = 1
    k_end: int | None = None  # None: k_start
    steps: int = 0  # anneal length for LINEAR; switch step for STEP

    def __post_init__(self):
        object.__setattr__(self, "kind", coerce_enum(self.kind, KScheduleKind, "KSchedule.kind"))
        object.__setattr__(self, "k_start", check_int(self.k_start, "KSchedule.k_start", 1))
        k_end = self.k_start if self.k_end is None else self.k_end
        object.__setattr__(self, "k_end", check_int(k_end, "KSchedule.k_end", 1))
        min_steps = 0 if self.kind is KScheduleKind.CONSTANT else 1
        object.__setattr__(self, "steps", check_int(self.steps, "KSchedule.steps", min_steps))
        if self.kind is KScheduleKind.CONSTANT and self.k_end != self.k_start:
            raise ValueError(
                f"`KSchedule.k_end`={self.k_end} differs from k_start={self.k_start} but kind "
                "is CONSTANT; use LINEAR or STEP to anneal."
            )

    def __call__(self, step: int) -> int:
        step = check_int(step, "step", 0)
        if self.kind is KScheduleKind.CONSTANT:
            return self.k_start
        if self.kind is KScheduleKind.STEP:
            return self.k_start if step < self.steps else self.k_end
        frac = min(step, self.steps) / self.steps
        return int(math.floor(self.k_start + (self.k_end - self.k_start) * frac + 0.5))

    def values(self) -> tuple[int, ...]:
        """The distinct k this schedule ever returns, ascending."""
        lo, hi = sorted((self.k_start, self.k_end))
        if self.kind is not KScheduleKind.LINEAR:
            return tuple(sorted({lo, hi}))
        if self.steps >= hi - lo:  # k moves by at most 1 per step: it visits all of [lo, hi]
            return tuple(range(lo, hi + 1))
        return tuple(sorted({self(s) for s in range(self.steps + 1)}))


# Estimators with an exact off-policy form (docs/estimators.md section 4). A set: format
# it with offpolicy_estimator_names() for a stable order.
OFFPOLICY_ESTIMATORS: frozenset[MaxAtKEstimator] = frozenset(
    {MaxAtKEstimator.S, MaxAtKEstimator.LOO_MINUS_ONE, MaxAtKEstimator.L2O}
)


def lag_exact_problem(cfg: ObjectiveConfig) -> str | None:
    """Why rl.lag_correction=EXACT cannot make stale rollouts exact for objective cfg, or
    None when it can: MEAN with a baseline that does not depend on y_i (sequence ratio
    alone), MAX_AT_K with an estimator of OFFPOLICY_ESTIMATORS (the others' ratios too);
    rewards from the verifier in both (a vote's pseudo-label depends on every sample)."""
    if cfg.reward is not RewardSource.VERIFIER:
        return f"objective.reward={cfg.reward.name} scores each sample by the group's vote"
    if cfg.objective is Objective.MEAN:
        if cfg.mean_baseline in (MeanBaseline.RLOO, MeanBaseline.SHRINKAGE):
            return None
        return (
            f"objective.mean_baseline={cfg.mean_baseline.name} includes the sample's own "
            "reward (use RLOO or SHRINKAGE)"
        )
    if cfg.objective is Objective.MAX_AT_K:
        if cfg.max_at_k_shrinkage:
            return "objective.max_at_k_shrinkage has no exact off-policy form"
        if cfg.max_at_k_estimator in OFFPOLICY_ESTIMATORS:
            return None
        return (
            f"objective.max_at_k_estimator={cfg.max_at_k_estimator.name} has no exact "
            f"off-policy form (use {offpolicy_estimator_names(' / ')})"
        )
    return f"objective {cfg.objective.name} has no exact off-policy form in kjax"


def offpolicy_estimator_names(sep: str = " / ") -> str:
    """The names of OFFPOLICY_ESTIMATORS in MaxAtKEstimator's order, joined by sep."""
    return sep.join(e.name for e in MaxAtKEstimator if e in OFFPOLICY_ESTIMATORS)


def _mixture_weights(value) -> tuple[tuple[int, float], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = tuple(sorted((k, w) for k, w in items))
    except (TypeError, ValueError):
        raise ValueError(
            f"`ObjectiveConfig.mixture_weights` must be ((k, weight), ...); got {value!r}."
        ) from None
    for k, w in pairs:
        check_int(k, "ObjectiveConfig.mixture_weights k", 1)
        if not (is_real(w) and math.isfinite(w) and w >= 0):
            raise ValueError(
                f"`ObjectiveConfig.mixture_weights`: weight of k={k} must be a "
                f"finite float >= 0; got {w!r}."
            )
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError(f"`ObjectiveConfig.mixture_weights` repeats a k; got {value!r}.")
    return tuple((int(k), float(w)) for k, w in pairs)


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """The objective and its estimator; validated on construction (fields named in errors).

    k: the objective's k (1 for MEAN and MAX_AT_K_MIXTURE); a KSchedule may override it.
      For BON_DISTILL, k is the n of the best-of-n distribution being distilled (>= 2; it
      may exceed N). It is k rather than a field of its own because k is kjax's
      inference-time budget, which is what best-of-n spends, a KSchedule can then grow
      it, and a new field would change every run's identity (kjax.rl.config.to_json),
      so that existing workdirs would refuse to resume.
    mean_baseline: MEAN's baseline (RLOO unbiased; GROUP_MEAN Dr.GRPO; GROUP_ZSCORE GRPO;
      SHRINKAGE: RLOO shrunk toward the other prompts' means, unbiased, couples the batch).
    max_at_k_estimator: the estimator of MAX_AT_K and of each k of MAX_AT_K_MIXTURE
      (LOO_MINUS_ONE recommended; see kjax.objectives.MaxAtKEstimator for which are biased).
    majority_centered: MAJORITY_AT_K subtracts the group mean (Tang et al.'s biased variant).
    mixture_weights: MAX_AT_K_MIXTURE's ((k, w_k), ...); or maxrl_t = T for w_k = 1/k,
      k <= T (MaxRL, Tajwar, Zeng et al. 2026). Exactly one of the two is set.
    max_at_k_shrinkage: MAX_AT_K and MAX_AT_K_MIXTURE with LOO, L2O or LOO_MINUS_ONE: the
      estimator's leave-one-out baseline shrunk toward the other prompts of the batch
      (kjax.objectives.shrink_max_at_k_advantages; unbiased, couples the batch).
    reward: RewardSource, the rewards the objective is computed on (MAJORITY_VOTE: TTRL's
      label-free vote; any objective but MAJORITY_AT_K).
    min_agreement: MAJORITY_VOTE only: groups whose plurality holds fewer than this
      fraction of the N samples get no label (all rewards 0); 0 labels every group.
    bon_anchor: BON_DISTILL only: BonAnchor, the group (GROUP, the default: the current
      policy) or M fresh samples of the fixed reference per prompt (REFERENCE: vBoN's
      objective; needs rl.kl_coef > 0, and rl.kl_coef = 1 is vBoN's weight).
    bon_anchor_samples: M, the reference samples per prompt of bon_anchor=REFERENCE (>= 1;
      M = N reuses the sampler compiled for the policy's samples); 0 otherwise.

    The last five fields were added after runs had been written; at their defaults they
    are left out of the run's identity (kjax.rl.config.to_json), so those runs resume.
    """

    objective: Objective = Objective.MEAN
    k: int = 1
    mean_baseline: MeanBaseline = MeanBaseline.RLOO
    max_at_k_estimator: MaxAtKEstimator = MaxAtKEstimator.LOO_MINUS_ONE
    majority_centered: bool = False
    mixture_weights: tuple[tuple[int, float], ...] = ()
    maxrl_t: int = 0
    max_at_k_shrinkage: bool = dataclasses.field(default=False, metadata=IDENTITY_IF_SET)
    reward: RewardSource = dataclasses.field(
        default=RewardSource.VERIFIER, metadata=IDENTITY_IF_SET
    )
    min_agreement: float = dataclasses.field(default=0.0, metadata=IDENTITY_IF_SET)
    bon_anchor: BonAnchor = dataclasses.field(default=BonAnchor.GROUP, metadata=IDENTITY_IF_SET)
    bon_anchor_samples: int = dataclasses.field(default=0, metadata=IDENTITY_IF_SET)

    def __post_init__(self):
        for field, cls in (
            ("objective", Objective),
            ("mean_baseline", MeanBaseline),
            ("max_at_k_estimator", MaxAtKEstimator),
            ("reward", RewardSource),
            ("bon_anchor", BonAnchor),
        ):
            value = coerce_enum(getattr(self, field), cls, f"ObjectiveConfig.{field}")
            object.__setattr__(self, field, value)
        object.__setattr__(self, "k", check_int(self.k, "ObjectiveConfig.k", 1))
        object.__setattr__(self, "mixture_weights", _mixture_weights(self.mixture_weights))
        object.__setattr__(self, "maxrl_t", check_int(self.maxrl_t, "ObjectiveConfig.maxrl_t", 0))
        one_k = (Objective.MEAN, Objective.MAX_AT_K_MIXTURE, Objective.MAXRL_PRACTICAL)
        if self.objective in one_k and self.k != 1:
            raise ValueError(
                f"`ObjectiveConfig.k`={self.k} but objective is {self.objective.name}, whose k "
                "is not a single number; leave k=1 (mixtures take mixture_weights/maxrl_t)."
            )
        mixture = self.objective is Objective.MAX_AT_K_MIXTURE
        if mixture and bool(self.mixture_weights) == bool(self.maxrl_t):
            raise ValueError(
                "`ObjectiveConfig.mixture_weights` / `maxrl_t`: MAX_AT_K_MIXTURE needs exactly "
                f"one of them; got mixture_weights={self.mixture_weights}, "
                f"maxrl_t={self.maxrl_t}."
            )
        if mixture and self.max_at_k_estimator is MaxAtKEstimator.CHEN_ANALYTIC:
            raise ValueError(
                "`ObjectiveConfig.max_at_k_estimator`=CHEN_ANALYTIC is normalised per k by its "
                "own sigma, so a weighted sum of it has no objective; pick another estimator "
                "for MAX_AT_K_MIXTURE."
            )
        if not mixture and (self.mixture_weights or self.maxrl_t):
            raise ValueError(
                "`ObjectiveConfig.mixture_weights` / `maxrl_t` are only read by "
                f"MAX_AT_K_MIXTURE; objective is {self.objective.name}. Unset them."
            )
        if self.objective is Objective.BON_DISTILL and self.k < 2:
            raise ValueError(
                f"`ObjectiveConfig.k`={self.k} but objective BON_DISTILL distils best-of-k "
                "(the n of vBoN / BOND), and best-of-1 is the policy itself; set k >= 2, "
                "e.g. k=8."
            )
        for field in ("majority_centered", "max_at_k_shrinkage"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(
                    f"`ObjectiveConfig.{field}` must be a bool; got {getattr(self, field)!r}."
                )
        self._check_shrinkage_and_reward()
        self._check_bon_anchor()

    def _check_bon_anchor(self) -> None:
        m = check_int(self.bon_anchor_samples, "ObjectiveConfig.bon_anchor_samples", 0)
        object.__setattr__(self, "bon_anchor_samples", m)
        if self.bon_anchor is BonAnchor.REFERENCE:
            if self.objective is not Objective.BON_DISTILL:
                raise ValueError(
                    "`ObjectiveConfig.bon_anchor`=REFERENCE is the anchor of best-of-k "
                    f"distillation; objective is {self.objective.name}. Set "
                    "objective=bon_distill, or leave bon_anchor=group."
                )
            if m < 1:
                raise ValueError(
                    "`ObjectiveConfig.bon_anchor_samples` must be >= 1 with "
                    "bon_anchor=REFERENCE (M reference samples per prompt estimate the "
                    f"reference's reward CDF); got {m}. E.g. set it to N (config.samples)."
                )
        elif m:
            raise ValueError(
                f"`ObjectiveConfig.bon_anchor_samples`={m} is only read with "
                "bon_anchor=REFERENCE (the GROUP anchor is the group's own samples); unset "
                "it or set bon_anchor=reference."
            )

    def _check_shrinkage_and_reward(self) -> None:
        if self.max_at_k_shrinkage and not (
            self.objective in (Objective.MAX_AT_K, Objective.MAX_AT_K_MIXTURE)
            and self.max_at_k_estimator in SHRINKABLE
        ):
            names = "/".join(e.name for e in SHRINKABLE)
            raise ValueError(
                "`ObjectiveConfig.max_at_k_shrinkage` shrinks the leave-one-out baseline of "
                f"MAX_AT_K or MAX_AT_K_MIXTURE with estimator {names}; got objective "
                f"{self.objective.name}, estimator {self.max_at_k_estimator.name}. For the "
                "mean objective use mean_baseline=shrinkage."
            )
        agreement = self.min_agreement
        if isinstance(agreement, bool) or not is_real(agreement) or not 0 <= agreement <= 1:
            raise ValueError(
                f"`ObjectiveConfig.min_agreement` must be a float in [0, 1]; got {agreement!r}."
            )
        object.__setattr__(self, "min_agreement", float(agreement))
        vote = self.reward is RewardSource.MAJORITY_VOTE
        if vote and self.objective is Objective.MAJORITY_AT_K:
            raise ValueError(
                "`ObjectiveConfig.reward`=MAJORITY_VOTE scores samples against the group's own "
                "vote, and MAJORITY_AT_K needs a reference answer to vote against; use "
                "objective=mean or max_at_k with reward=majority_vote (TTRL)."
            )
        if not vote and self.min_agreement:
            raise ValueError(
                f"`ObjectiveConfig.min_agreement`={self.min_agreement} is only read with "
                "reward=majority_vote; unset it or set reward=majority_vote."
            )

    def mixture_ks(self) -> tuple[int, ...]:
        """The k of every term of MAX_AT_K_MIXTURE, ascending."""
        if self.maxrl_t:
            return tuple(range(1, self.maxrl_t + 1))
        return tuple(k for k, _ in self.mixture_weights)

    def check_samples(self, n: int, schedule: KSchedule | None = None) -> None:
        """Raises before any compute if N samples per prompt cannot serve every k used."""
        n = check_int(n, "N (samples per prompt)", 1)
        ks = (self.k,) if schedule is None else schedule.values()
        field = "ObjectiveConfig.k" if schedule is None else "KSchedule k_start/k_end"
        if self.objective is Objective.MAXRL_PRACTICAL:
            if ks != (1,):
                raise ValueError(
                    f"`{field}` must be 1 for objective MAXRL_PRACTICAL; got k in {ks}."
                )
            if n < 2:
                raise ValueError("`N (samples per prompt)`: MAXRL_PRACTICAL needs N >= 2.")
            return
        if self.objective is Objective.MEAN:
            if ks != (1,):
                raise ValueError(f"`{field}` must be 1 for objective MEAN; got k in {ks}.")
            loo = (MeanBaseline.RLOO, MeanBaseline.SHRINKAGE)  # leave-one-out baselines
            if self.mean_baseline in loo and n < 2:
                raise ValueError(
                    f"`ObjectiveConfig.mean_baseline`={self.mean_baseline.name} needs N >= 2 "
                    "samples."
                )
            return
        if self.objective is Objective.BON_DISTILL:
            # k is best-of-k's n, a target rather than a subset size: k > N is fine.
            if min(ks) < 2:
                raise ValueError(f"`{field}`: BON_DISTILL needs k >= 2 (best-of-k); got k in {ks}.")
            if self.bon_anchor is BonAnchor.REFERENCE and n < 2:
                raise ValueError(
                    f"`N (samples per prompt)`={n}: BON_DISTILL with bon_anchor=REFERENCE "
                    "takes a leave-one-out (RLOO) baseline of the transformed rewards, so it "
                    "needs N >= 2."
                )
            if self.bon_anchor is BonAnchor.GROUP and n < 3:
                raise ValueError(
                    f"`N (samples per prompt)`={n}: BON_DISTILL's anchors are the group's other "
                    "samples and its baseline leaves two out, so it needs N >= 3."
                )
            return
        if self.objective is Objective.MAX_AT_K_MIXTURE:
            if schedule is not None:
                raise ValueError(
                    "`k_schedule` cannot anneal MAX_AT_K_MIXTURE (its weights "
                    "set every k); unset k_schedule."
                )
            ks, field = self.mixture_ks(), "ObjectiveConfig.mixture_weights/maxrl_t"
        estimator = self.max_at_k_estimator
        if self.objective is not Objective.MAJORITY_AT_K:
            # Estimators that leave one sample out of a k-subset of the others (LOO, L2O)
            # need N > k; min_samples says so, and k > N is refused below for the rest.
            need = estimator.min_samples(max(ks))
            if n < need and need > max(ks):
                raise ValueError(
                    f"`{field}`: k={max(ks)} with {estimator.name} needs N >= {need} "
                    f"samples per prompt; got N={n}. Lower k or sample more."
                )
        if max(ks) > n:
            raise ValueError(f"`{field}`: k={max(ks)} > N={n} samples per prompt.")
