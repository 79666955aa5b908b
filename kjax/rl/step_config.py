"""How a rollout batch becomes updates (StepConfig) and the optimizer's hyperparameters.

A leaf module: kjax.rl.train_step, kjax.rl.losses and kjax.rl.optim implement what these
options name.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers

from kjax._fields import IDENTITY_IF_SET, check_int, coerce_enums, is_real


class PolicyLoss(enum.Enum):
    PG = "pg"  # REINFORCE surrogate: exactly one update per rollout
    PPO = "ppo"  # clipped ratio against the step's starting policy; reuse is allowed


class LossAggregation(enum.Enum):
    """How the token axis T of a per-token loss becomes one value per sequence.

    With L_i valid tokens in sample i (mask sum) and T_max a constant:
      TOKEN_SUM            sum_t x_t. Exact: sum_t grad log pi(y_t | y_<t) = grad log pi(y_i),
                           so the surrogate is the sequence-level score function. Unbiased.
      CONSTANT_NORMALIZER  sum_t x_t / T_max (Dr.GRPO, Liu et al. 2025). Unbiased up to the
                           constant 1/T_max: the same direction as TOKEN_SUM.
      SEQ_MEAN_TOKEN_MEAN  sum_t x_t / L_i (GRPO, Shao et al. 2024). Biased: sample i's
                           gradient is scaled by 1/L_i, which correlates with its reward
                           (long wrong answers are penalised less per token; Liu et al. 2025).
    """

    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    CONSTANT_NORMALIZER = "constant_normalizer"
    TOKEN_SUM = "token_sum"


class KLEstimator(enum.Enum):
    """Per-token estimators of KL(pi || pi_ref) from y ~ pi, log r = log pi_ref(y) - log pi(y)
    (Schulman 2020). As a loss they differ (Tang & Munos 2025, "On a few pitfalls in KL
    divergence gradient estimation for RL"):
      K1 = -log r: unbiased value, but its gradient grad log pi(y) is 0 in expectation, so
        it is refused as a penalty (a metric only).
      K2 = (log r)^2 / 2: biased value; its expected gradient is exactly grad KL(pi || ref).
      K3 = r - 1 - log r: unbiased value, >= 0; expected gradient grad KL(ref || pi) (GRPO).
    """

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


class RatioLevel(enum.Enum):
    """Where PPO's importance ratio pi_theta / pi_old is taken and clipped.

    TOKEN     rho_t = pi(y_t | y_<t) / pi_old(y_t | y_<t), one per token, each clipped and
              multiplied by the sample's advantage (Schulman et al. 2017; what GRPO does).
              Its gradient is sum_t rho_t A grad log pi(y_t | y_<t), which is NOT
              rho(y) A grad log pi(y) once the policy has moved and T > 1.
    SEQUENCE  rho = prod_t rho_t = exp(sum_t mask (log pi - log pi_old)), one per sample,
              clipped once (as GSPO does, without its 1/|y| length normalisation): the
              surrogate rho A' has gradient rho A' grad log pi(y), the importance-weighted
              score function. Off-policy max@k (OffPolicyMaxAtK EXACT, LINEAR) needs it:
              its re-weighted advantage A'_i multiplies the sample's sequence ratio
              (kjax/objectives/offpolicy.py has the derivation).
    """

    TOKEN = "token"
    SEQUENCE = "sequence"


class OffPolicyMaxAtK(enum.Enum):
    """MAX_AT_K advantages of updates after a step's first (the policy has moved from the
    one that sampled): OFF keeps the rollout's advantages inside the clipped PPO
    surrogate; EXACT / LINEAR re-weight them each update by the other samples' sequence
    ratios (Bagirov et al. 2025), exactly or to first order. Both need
    RatioLevel.SEQUENCE: the re-weighted advantage multiplies the sample's own sequence
    ratio, so the expected update is grad J_k exactly (EXACT) for completions of any
    length; a per-token ratio is exact only for one-token completions."""

    OFF = "off"
    EXACT = "exact"
    LINEAR = "linear"


class LagCorrection(enum.Enum):
    """How an update corrects rollouts drawn `policy_lag` = d updates ago (asynchronous RL:
    the rollout of step t comes from the parameters of step t - d, the behaviour policy mu,
    whose log-probs arrive as the batch's sampler_logprobs).

    NONE   the rollout is used as if on-policy. Biased for every objective once d > 0.
    TIS    truncated importance weights min(pi_theta / mu, tis_cap) per token (or per
           sequence), what verl, prime-rl and NeMo-RL do for the mean objective. Biased even
           untruncated: a token's own ratio is not the sequence's once T > 1 (enumerated in
           tests/rl/test_lag_exactness.py: 13-15% off for the mean objective with a cap that
           never binds), and for a k-sample objective one weight per sample still misses
           the OTHER samples' ratios, on which max@k's advantage of y_i depends.
    EXACT  every update re-weights the advantages by the others' sequence ratios against mu
           (Bagirov et al.'s exact off-policy max@k, kjax/objectives/offpolicy.py) and
           multiplies sample i's own score function by its sequence ratio rho_i = pi_theta(y_i)
           / mu(y_i): the expected update is grad J_k of the current policy, for any d.
           Objective MEAN with a baseline that does not depend on y_i (RLOO, SHRINKAGE) needs
           only rho_i. Untruncated, so its variance grows with how far pi_theta is from mu;
           w_i A_i is formed in log space (kjax.rl.losses.importance_weighted_advantages).
           PPO is decoupled (Hilton et al. 2021): the weight pi_start / mu times PPO's ratio
           pi_theta / pi_start clipped around the step's starting policy, so the update is
           exact wherever the clip does not bind, always on a step's first update. Refused
           with what would truncate or reshape rho_i A_i: tis_cap, offpolicy_clamp,
           offpolicy_max_at_k=LINEAR, aggregation SEQ_MEAN_TOKEN_MEAN. The KL penalty and
           entropy bonus are NOT importance-weighted: they are estimated on mu's samples (the
           run's log says so).
    """

    NONE = "none"
    TIS = "tis"
    EXACT = "exact"


class PackMode(enum.Enum):
    """How the update lays out completions (kjax.rl.packing). All give the same loss and
    gradients to float rounding.
      OFF    every completion padded to T: the forward and backward run on all B x N x T.
      GROUP  each group's completions packed end to end into R <= N rows of T (R from
             {N/4, N/2, 3N/4, N}, chosen per step from the mask), the prompt still once per
             group: no compute on padding beyond the last row's tail and the bucket. One R
             serves every group: the fullest group's.
      BATCH  each group packed as in GROUP into the R_g rows it needs, and the rows of the
             G groups of each batch shard laid end to end (kjax.rl.batch_packing): a
             shard runs sum_g R_g rows (the largest shard's, rounded up to eighths of
             G*N), each row attending its own group's prompt, still run once per group.
    """

    OFF = "off"
    GROUP = "group"
    BATCH = "batch"


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """How one rollout batch becomes updates: epochs x minibatches optimizer updates,
    each accumulating gradients over `microbatches` (all split B; N stays whole).

    Advantages are computed once per rollout with the configured estimator. PG makes one
    update (epochs = minibatches = 1: a reused sample needs a ratio); PPO's later updates
    use each sample's own ratio against the step's starting policy, clipped.
    kl_coef / entropy_coef: penalty and bonus per sequence, reduced over T by
      `aggregation` like the surrogate and averaged over B and N.
    ratio_level: PPO's ratio per token or per sequence (RatioLevel); with SEQUENCE the
      per-sequence surrogate is scaled like the token aggregation scales a sequence's
      gradient (1, 1/T_max, 1/L_i), so a first, on-policy update is the same either way.
    tis_cap: truncated importance weights against the sampler's logprobs (None: off);
      per token, or per sample of the sequence ratio with ratio_level=SEQUENCE.
    offpolicy_max_at_k, offpolicy_clamp: see OffPolicyMaxAtK; the clamp truncates the
      others' ratio products (None: untruncated).
    policy_lag: d >= 0, the staleness of the rollouts: step t's come from the parameters of
      step t - d (the first d steps' from the initial ones). 0 is the synchronous loop.
    lag_correction: LagCorrection, how the update corrects that staleness (TIS reads
      tis_cap; EXACT needs PG, or PPO with ratio_level=SEQUENCE (decoupled), and none of
      tis_cap, offpolicy_clamp, SEQ_MEAN_TOKEN_MEAN).
    pack: PackMode, whether the update runs on padded or packed completions.
    sequence_parallel: on a mesh with tensor > 1, the update's residual stream between
      layers splits its positions over tensor (kjax.sharding.sequence_split): the layer
      scan keeps 1/tensor of each layer's saved input, for more interconnect traffic
      (the layers gather and reduce-scatter around their projections). Off: the stream
      is whole on every tensor device. Values are the same either way.
    """

    loss: PolicyLoss = PolicyLoss.PG
    epochs: int = 1
    minibatches: int = 1
    microbatches: int = 1
    aggregation: LossAggregation = LossAggregation.TOKEN_SUM
    ppo_epsilon: float = 0.2
    ratio_level: RatioLevel = RatioLevel.TOKEN
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = KLEstimator.K3
    entropy_coef: float = 0.0
    tis_cap: float | None = None
    offpolicy_max_at_k: OffPolicyMaxAtK = OffPolicyMaxAtK.OFF
    offpolicy_clamp: float | None = None
    policy_lag: int = 0
    lag_correction: LagCorrection = LagCorrection.NONE
    pack: PackMode = dataclasses.field(default=PackMode.OFF, metadata=IDENTITY_IF_SET)
    sequence_parallel: bool = dataclasses.field(default=False, metadata=IDENTITY_IF_SET)

    def __post_init__(self):
        coerce_enums(self, "rl.")
        for field in ("epochs", "minibatches", "microbatches"):
            check_int(getattr(self, field), f"rl.{field}", 1)
        check_int(self.policy_lag, "rl.policy_lag", 0)
        self._check_lag()
        if self.loss is PolicyLoss.PG and (self.epochs > 1 or self.minibatches > 1):
            raise ValueError(
                f"`rl.loss`=PG with rl.epochs={self.epochs}, rl.minibatches={self.minibatches}: "
                "every update after the first would reuse samples of an older policy without "
                "an importance ratio (a biased gradient). Use rl.loss=PPO, or epochs=1 and "
                "minibatches=1 (microbatches accumulate one update)."
            )
        if not (is_real(self.ppo_epsilon) and 0 < self.ppo_epsilon < 1):
            raise ValueError(f"`rl.ppo_epsilon` must be in (0, 1); got {self.ppo_epsilon!r}.")
        if self.dual_clip is not None and not (is_real(self.dual_clip) and self.dual_clip > 1):
            raise ValueError(f"`rl.dual_clip` must be > 1 or None; got {self.dual_clip!r}.")
        for field in ("kl_coef", "entropy_coef"):
            value = getattr(self, field)
            if not (is_real(value) and value >= 0):
                raise ValueError(f"`rl.{field}` must be >= 0; got {value!r}.")
        if self.kl_estimator is KLEstimator.K1:
            raise ValueError(
                "`rl.kl_estimator`=K1 is refused: differentiated as a loss its expected "
                "gradient is 0, so it penalises nothing (Tang & Munos 2025). Use K3 "
                "(grad KL(ref || pi)) or K2 (grad KL(pi || ref))."
            )
        if self.tis_cap is not None and not (is_real(self.tis_cap) and self.tis_cap > 0):
            raise ValueError(f"`rl.tis_cap` must be > 0 or None; got {self.tis_cap!r}.")
        if self.ratio_level is RatioLevel.SEQUENCE:
            if self.loss is not PolicyLoss.PPO:
                raise ValueError(
                    "`rl.ratio_level`=SEQUENCE sets where PPO's ratio is taken; rl.loss is "
                    f"{self.loss.name}, which has no ratio. Set rl.loss=PPO or leave "
                    "rl.ratio_level=TOKEN."
                )
        clamp = self.offpolicy_clamp
        if self.offpolicy_max_at_k is OffPolicyMaxAtK.OFF:
            if clamp is not None:
                raise ValueError(
                    "`rl.offpolicy_clamp` is only read with rl.offpolicy_max_at_k "
                    f"EXACT or LINEAR; it is OFF. Unset it (got {clamp!r})."
                )
            return
        if self.loss is not PolicyLoss.PPO or self.epochs * self.minibatches == 1:
            raise ValueError(
                f"`rl.offpolicy_max_at_k`={self.offpolicy_max_at_k.name} re-weights updates "
                "after a step's first inside the PPO surrogate; it needs rl.loss=PPO and "
                f"rl.epochs * rl.minibatches > 1 (got loss={self.loss.name}, "
                f"epochs={self.epochs}, minibatches={self.minibatches})."
            )
        if clamp is not None and not (is_real(clamp) and clamp > 0):
            raise ValueError(f"`rl.offpolicy_clamp` must be > 0 or None; got {clamp!r}.")
        if self.ratio_level is not RatioLevel.SEQUENCE:
            raise ValueError(
                f"`rl.offpolicy_max_at_k`={self.offpolicy_max_at_k.name} needs "
                "rl.ratio_level=SEQUENCE: its re-weighted advantage multiplies each sample's "
                "sequence ratio prod_t pi/pi_old, and a per-token ratio "
                f"(rl.ratio_level={self.ratio_level.name}) makes the update inexact for "
                "completions longer than one token. Set rl.ratio_level=SEQUENCE."
            )

    def _check_lag(self) -> None:
        fix = "set rl.lag_correction to NONE, TIS or EXACT (LagCorrection explains each)"
        if self.lag_correction is LagCorrection.TIS and self.tis_cap is None:
            raise ValueError(
                "`rl.lag_correction`=TIS truncates the importance weights at rl.tis_cap, which "
                "is unset. Set rl.tis_cap (e.g. 2.0), or choose another correction."
            )
        if self.lag_correction is LagCorrection.NONE and self.tis_cap is not None:
            if self.policy_lag > 0:
                raise ValueError(
                    f"`rl.tis_cap`={self.tis_cap!r} with rl.policy_lag={self.policy_lag} and "
                    "rl.lag_correction=NONE: say which correction you mean; set "
                    "rl.lag_correction=TIS to weight the stale rollouts by their truncated "
                    "ratios, or unset rl.tis_cap."
                )
        if self.lag_correction is not LagCorrection.EXACT:
            return
        if self.tis_cap is not None:
            raise ValueError(
                "`rl.lag_correction`=EXACT weights each sample by its untruncated sequence "
                f"ratio; rl.tis_cap={self.tis_cap!r} would truncate it. Unset rl.tis_cap, or "
                f"{fix}."
            )
        if self.loss is PolicyLoss.PPO and self.ratio_level is not RatioLevel.SEQUENCE:
            raise ValueError(
                "`rl.lag_correction`=EXACT with rl.loss=PPO needs rl.ratio_level=SEQUENCE: "
                "the re-weighted advantage multiplies each sample's sequence ratio "
                "pi_theta(y) / mu(y), which a per-token ratio is not once T > 1."
            )
        if self.offpolicy_clamp is not None:
            raise ValueError(
                "`rl.lag_correction`=EXACT re-weights by the others' untruncated ratios; "
                f"rl.offpolicy_clamp={self.offpolicy_clamp!r} would truncate them (a biased "
                f"gradient). Unset rl.offpolicy_clamp, or {fix}."
            )
        if self.aggregation is LossAggregation.SEQ_MEAN_TOKEN_MEAN:
            raise ValueError(
                "`rl.lag_correction`=EXACT promises grad J_k, but rl.aggregation="
                "SEQ_MEAN_TOKEN_MEAN scales sample i's gradient by 1/L_i (GRPO's per-length "
                "mean; biased, LossAggregation). Set rl.aggregation=TOKEN_SUM or "
                f"CONSTANT_NORMALIZER, or {fix}."
            )
        if self.offpolicy_max_at_k is OffPolicyMaxAtK.LINEAR:
            raise ValueError(
                "`rl.lag_correction`=EXACT re-weights every update exactly; "
                "rl.offpolicy_max_at_k=LINEAR would approximate the later ones. Set it to "
                "EXACT or OFF (the same exact re-weighting applies to every update)."
            )

    @property
    def updates(self) -> int:
        """Optimizer updates per rollout batch."""
        return self.epochs * self.minibatches

    @property
    def needs_old_logprobs(self) -> bool:
        """Whether the update needs the step's starting policy's log-probs (PPO's ratio, TIS).
        With lag_correction=EXACT, PG's ratio's denominator is the behaviour policy, whose
        log-probs the batch carries (sampler_logprobs), so none are computed; PPO still
        clips around the step's starting policy (decoupled PPO) and needs them."""
        if self.lag_correction is LagCorrection.EXACT:
            return self.loss is PolicyLoss.PPO  # decoupled: PPO clips around the start
        return self.loss is PolicyLoss.PPO or self.tis_cap is not None

    @property
    def reweights(self) -> bool:
        """Whether the update replaces the batch's advantages with off-policy ones (an
        exact lag correction, or off-policy max@k after a step's first update)."""
        exact_lag = self.lag_correction is LagCorrection.EXACT
        return exact_lag or self.offpolicy_max_at_k is not OffPolicyMaxAtK.OFF


# ---------------------------------------------------------------------------- optimizer


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
        def check(field, ok, want):
            if not ok:
                value = getattr(self, field)
                raise ValueError(f"`config.optimizer.{field}` must be {want}; got {value!r}.")

        def integer(field):
            value = getattr(self, field)
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        check(
            "learning_rate", is_real(self.learning_rate) and self.learning_rate > 0, "a float > 0"
        )
        check("warmup_steps", integer("warmup_steps") and self.warmup_steps >= 0, "an int >= 0")
        check(
            "total_steps",
            integer("total_steps") and self.total_steps > self.warmup_steps,
            f"an int > warmup_steps={self.warmup_steps}",
        )
        check(
            "end_lr_ratio",
            is_real(self.end_lr_ratio) and 0 <= self.end_lr_ratio <= 1,
            "a float in [0, 1]",
        )
        for field in ("b1", "b2"):
            value = getattr(self, field)
            check(field, is_real(value) and 0 <= value < 1, "a float in [0, 1)")
        check("eps", is_real(self.eps) and self.eps > 0, "a float > 0")
        check("weight_decay", is_real(self.weight_decay) and self.weight_decay >= 0, "a float >= 0")
        check("decay_vectors", isinstance(self.decay_vectors, bool), "a bool")
        clip = self.max_grad_norm
        check("max_grad_norm", clip is None or (is_real(clip) and clip > 0), "a float > 0 or None")
