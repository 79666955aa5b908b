"""Token-level RL and SFT losses: pure functions of explicit [B, N, T] arrays.

RL losses return (scalar loss, metrics). Score-function surrogates (policy gradient, PPO)
SUM over the N samples of a prompt and average over B, because kjax advantages are in the
sum convention (kjax.rl.objective); expectations (KL, entropy) average over B and N. The
option enums (LossAggregation, KLEstimator, RatioLevel) are defined in kjax.rl.step_config.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kjax.rl.step_config import (  # re-exported: losses.X
    KLEstimator,
    LossAggregation,
    RatioLevel,
)

Metrics = dict[str, jax.Array]


def _float(x: jax.Array) -> jax.Array:
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _check_rank(x, name: str, shape: str, ndim: int, kind) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != ndim:
        raise ValueError(f"`{name}` must have shape {shape}; got shape {tuple(x.shape)}.")
    if not jnp.issubdtype(x.dtype, kind):
        raise ValueError(f"`{name}` must have a {kind.__name__} dtype; got {x.dtype}.")
    return x


def _check_like(x, name: str, ref: jax.Array, ref_name: str, kind=jnp.floating) -> jax.Array:
    x = _check_rank(x, name, f"{list(ref.shape)} like `{ref_name}`", ref.ndim, kind)
    if x.shape != ref.shape:
        raise ValueError(
            f"`{name}` must have the shape of `{ref_name}` {tuple(ref.shape)}; "
            f"got {tuple(x.shape)}."
        )
    return x


def _check_tokens(logprobs, mask, advantages=None):
    """Validates logprobs [B,N,T] float, mask [B,N,T] bool and advantages [B,N] float."""
    logprobs = _check_rank(logprobs, "logprobs", "[B, N, T]", 3, jnp.floating)
    mask = _check_like(mask, "mask", logprobs, "logprobs", jnp.bool_)
    if advantages is None:
        return logprobs, mask
    advantages = _check_rank(advantages, "advantages", "[B, N]", 2, jnp.floating)
    if advantages.shape != logprobs.shape[:2]:
        raise ValueError(
            f"`advantages` must have shape [B, N] = {tuple(logprobs.shape[:2])} (the leading "
            f"axes of `logprobs`); got {tuple(advantages.shape)}."
        )
    return logprobs, mask, advantages


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x over the True entries of mask (0 when there are none); same shapes."""
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def aggregate_tokens(
    x: jax.Array, mask: jax.Array, aggregation: LossAggregation, max_len: int | None = None
) -> jax.Array:
    """Reduces the token axis: x [..., T] float, mask [..., T] bool -> [...] per sequence.

    max_len: T_max for CONSTANT_NORMALIZER (the generation budget; default T).
    """
    x = jnp.where(mask, x, 0.0)  # padding may hold inf/nan logprobs; never let them in
    total = jnp.sum(x, axis=-1)
    if aggregation is LossAggregation.TOKEN_SUM:
        return total
    if aggregation is LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        return total / jnp.maximum(jnp.sum(mask, axis=-1), 1)
    if aggregation is LossAggregation.CONSTANT_NORMALIZER:
        t_max = x.shape[-1] if max_len is None else max_len
        if isinstance(t_max, bool) or not isinstance(t_max, int) or t_max < 1:
            raise ValueError(f"`max_len` must be a positive int (T_max); got {max_len!r}.")
        return total / t_max
    raise ValueError(f"`aggregation` must be a LossAggregation; got {aggregation!r}.")


def sequence_logprob(logprobs: jax.Array, mask: jax.Array) -> jax.Array:
    """log pi(y) of each sample: sum_t of masked logprobs [B, N, T] -> [B, N].

    The difference of two of these (stop-gradient) is the `log_ratio` that
    kjax.rl.objective.compute_advantages takes for off-policy max@k.
    """
    logprobs, mask = _check_tokens(logprobs, mask)
    return jnp.sum(jnp.where(mask, _float(logprobs), 0.0), axis=-1)


def _surrogate(per_token, mask, aggregation, max_len) -> jax.Array:
    """-(1/B) sum_b sum_i agg_t(per_token): the sum convention over N (module docstring)."""
    return -jnp.mean(jnp.sum(aggregate_tokens(per_token, mask, aggregation, max_len), axis=1))


def _weights(is_weights, logprobs):
    if is_weights is None:
        return 1.0
    return jax.lax.stop_gradient(_check_like(is_weights, "is_weights", logprobs, "logprobs"))


def policy_gradient_loss(
    logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    aggregation: LossAggregation = LossAggregation.TOKEN_SUM,
    *,
    max_len: int | None = None,
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
    """REINFORCE surrogate (Williams 1992): -(1/B) sum_{b,i} A_bi agg_t[w_bit log pi(y_bit)].

    With TOKEN_SUM and no weights its gradient is -(1/B) sum_{b,i} A_bi grad log pi(y_bi),
    i.e. d loss / d logprobs[b,i,t] = -A_bi mask_bit / B; with sum-convention advantages
    this is an unbiased estimate of -grad J averaged over prompts.

    Args:
      logprobs: [B, N, T] float, log pi_theta of the sampled tokens (differentiated).
      advantages: [B, N] float, per-sample (treated as constants).
      mask: [B, N, T] bool, True on completion tokens.
      aggregation: reduction of T (LossAggregation); max_len: its T_max.
      is_weights: optional [B, N, T] per-token weights (e.g. truncated_importance_weights),
        under stop_gradient.

    Returns:
      (scalar loss, metrics: pg_loss, advantage_mean, advantage_abs_mean).
    """
    logprobs, mask, advantages = _check_tokens(logprobs, mask, advantages)
    adv = jax.lax.stop_gradient(_float(advantages))[..., None]
    per_token = _weights(is_weights, logprobs) * adv * _float(logprobs)
    loss = _surrogate(per_token, mask, aggregation, max_len)
    metrics = {
        "pg_loss": loss,
        "advantage_mean": jnp.mean(adv),
        "advantage_abs_mean": jnp.mean(jnp.abs(adv)),
    }
    return loss, metrics


def _clipped_objective(ratio, adv, epsilon, dual_clip):
    """PPO's min(rho A, clip(rho) A), with the dual clip max(., c A) for A < 0; elementwise.
    Returns (objective, is_clipped, is_dual)."""
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * adv
    obj = jnp.minimum(unclipped, clipped)
    is_clipped = clipped < unclipped
    is_dual = jnp.zeros(obj.shape, bool)
    if dual_clip is not None:
        floor = dual_clip * adv
        is_dual = (adv < 0) & (floor > obj)
        obj = jnp.where(adv < 0, jnp.maximum(obj, floor), obj)
    return obj, is_clipped, is_dual


# Largest log |w A| of an importance-weighted advantage: e^60 ~ 1.1e26. Below it the
# product is exact; it binds only where |w A| > 1.1e26 (so it CAN bind, and the trainer
# counts where it does), where the unguarded exp(log w) * A is inf or, for A = 0, nan.
MAX_LOG_WEIGHTED_ADVANTAGE = 60.0


def importance_weighted_advantages(
    log_weights: jax.Array, advantages: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """w * A with w = exp(log_weights), in log space: log_weights, advantages [B, N] -> [B, N].

    Computed as sign(A) exp(min(log w + log|A|, MAX_LOG_WEIGHTED_ADVANTAGE)) and exactly 0
    where A = 0: exp(log w) overflows float32 once log w > 88.7, and inf * 0 is nan, so a
    single runaway ratio with a zero advantage would otherwise stop the run. Because w > 0,
    w A passed as the advantage of policy_gradient_loss or ppo_clip_loss is the same loss as
    A with the weight w (min and max commute with a positive scale). Under stop_gradient.

    Returns:
      (w A [B, N], capped [B, N] bool: where the clamp bound, i.e. |w A| > e^60).
    """
    log_w = jax.lax.stop_gradient(_float(log_weights))
    adv = jax.lax.stop_gradient(_float(advantages))
    zero = adv == 0
    log_abs = log_w + jnp.log(jnp.where(zero, 1.0, jnp.abs(adv)))
    capped = ~zero & (log_abs > MAX_LOG_WEIGHTED_ADVANTAGE)
    magnitude = jnp.exp(jnp.minimum(log_abs, MAX_LOG_WEIGHTED_ADVANTAGE))
    return jnp.where(zero, 0.0, jnp.sign(adv) * magnitude), capped


# Largest sequence log-ratio exponentiated: exp(60) ~ 1e26 stays finite in float32 times any
# advantage, so a runaway sample cannot turn the loss (or, through exp's gradient, every
# other gradient) into inf/nan. Beyond it the ratio's gradient is 0; such a sample is
# clipped anyway unless its advantage is negative and no dual clip is set.
_MAX_SEQ_LOG_RATIO = 60.0


def ppo_clip_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    aggregation: LossAggregation = LossAggregation.TOKEN_SUM,
    *,
    epsilon: float = 0.2,
    dual_clip: float | None = None,
    max_len: int | None = None,
    is_weights: jax.Array | None = None,
    ratio_level: RatioLevel = RatioLevel.TOKEN,
) -> tuple[jax.Array, Metrics]:
    """PPO clipped-ratio surrogate (Schulman et al. 2017), optional dual clip (Ye et al. 2020).

    ratio_level=TOKEN: per token, with rho_t = exp(logprobs_t - old_logprobs_t),
      obj_t = min(rho_t A, clip(rho_t, 1 - eps, 1 + eps) A); with dual clip c > 1 and A < 0,
      obj_t = max(obj_t, c A). The loss is -(1/B) sum_{b,i} agg_t[w obj_t] as in
      policy_gradient_loss; d loss / d logprobs_t = -w A rho_t (aggregation weight) / B
      where unclipped and exactly 0 where clipped (A > 0, rho > 1+eps; A < 0, rho < 1-eps;
      A < 0, rho > c).
    ratio_level=SEQUENCE: one ratio per sample, rho = exp(sum_t mask (logprobs -
      old_logprobs)), clipped (and dual-clipped) once: obj = min(rho A, clip(rho) A). The
      loss is -(1/B) sum_{b,i} s_bi obj_bi with s the aggregation's per-sequence scale (1
      for TOKEN_SUM, 1/T_max for CONSTANT_NORMALIZER, 1/L_i for SEQ_MEAN_TOKEN_MEAN), so
      where unclipped d loss / d logprobs_t = -s A rho / B for every token of the sample:
      the importance-weighted score function rho A grad log pi(y), which off-policy max@k
      needs (kjax.objectives.offpolicy). is_weights are then per sample, [B, N].

    Args:
      logprobs: [B, N, T] float, current policy (differentiated).
      old_logprobs: [B, N, T] float, the policy that produced the advantages (constant).
      advantages: [B, N] float. mask: [B, N, T] bool.
      epsilon: static float in (0, 1). dual_clip: static float > 1, or None.
      aggregation, max_len: as in policy_gradient_loss.
      is_weights: optional weights under stop_gradient, [B, N, T] with TOKEN, [B, N] with
        SEQUENCE (truncated_importance_weights at the same ratio_level).
      ratio_level: RatioLevel.TOKEN or SEQUENCE (static).

    Returns:
      (scalar loss, metrics: ppo_loss, clip_fraction (tokens, or samples with SEQUENCE,
      whose gradient the epsilon clip zeroes), dual_clip_fraction, approx_kl (k3 estimate of
      KL(old || new) per token, or per sequence with SEQUENCE), ratio_mean, ratio_max).
    """
    logprobs, mask, advantages = _check_tokens(logprobs, mask, advantages)
    old_logprobs = _check_like(old_logprobs, "old_logprobs", logprobs, "logprobs")
    if not (isinstance(epsilon, (int, float)) and 0 < epsilon < 1):
        raise ValueError(f"`epsilon` must be a float in (0, 1); got {epsilon!r}.")
    if dual_clip is not None and not (isinstance(dual_clip, (int, float)) and dual_clip > 1):
        raise ValueError(f"`dual_clip` must be a float > 1 or None; got {dual_clip!r}.")
    if not isinstance(ratio_level, RatioLevel):
        raise ValueError(f"`ratio_level` must be a RatioLevel; got {ratio_level!r}.")

    adv = jax.lax.stop_gradient(_float(advantages))
    log_ratio = _float(logprobs) - jax.lax.stop_gradient(_float(old_logprobs))
    log_ratio = jnp.where(mask, log_ratio, 0.0)  # padding could overflow exp
    if ratio_level is RatioLevel.SEQUENCE:
        weights = 1.0
        if is_weights is not None:
            weights = jax.lax.stop_gradient(
                _check_like(is_weights, "is_weights", advantages, "advantages")
            )
        log_ratio = jnp.minimum(jnp.sum(log_ratio, axis=-1), _MAX_SEQ_LOG_RATIO)  # [B, N]
        ratio = jnp.exp(log_ratio)
        obj, is_clipped, is_dual = _clipped_objective(ratio, adv, epsilon, dual_clip)
        ones = jnp.ones(mask.shape, obj.dtype)
        lengths = jnp.sum(mask, axis=-1)
        scale = aggregate_tokens(ones, mask, aggregation, max_len) / jnp.maximum(lengths, 1)
        loss = -jnp.mean(jnp.sum(weights * scale * obj, axis=1))
        valid = lengths > 0
    else:
        ratio = jnp.exp(log_ratio)
        obj, is_clipped, is_dual = _clipped_objective(ratio, adv[..., None], epsilon, dual_clip)
        loss = _surrogate(_weights(is_weights, logprobs) * obj, mask, aggregation, max_len)
        valid = mask

    ratio_ng = jax.lax.stop_gradient(ratio)
    metrics = {
        "ppo_loss": loss,
        "clip_fraction": masked_mean(is_clipped & ~is_dual, valid),
        "dual_clip_fraction": masked_mean(is_dual, valid),
        "approx_kl": masked_mean(ratio_ng - 1.0 - jax.lax.stop_gradient(log_ratio), valid),
        "ratio_mean": masked_mean(ratio_ng, valid),
        "ratio_max": jnp.max(jnp.where(valid, ratio_ng, 0.0)),
    }
    return loss, metrics


def truncated_importance_weights(
    old_logprobs: jax.Array,
    sampler_logprobs: jax.Array,
    mask: jax.Array,
    cap: float = 2.0,
    ratio_level: RatioLevel = RatioLevel.TOKEN,
) -> tuple[jax.Array, Metrics]:
    """Truncated IS weights min(pi_train_old / pi_sampler, cap), under stop_gradient.

    Corrects the mismatch between the inference engine's token probabilities and the
    trainer's for the same parameters (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"); truncation as in IMPALA (Espeholt et al.
    2018). Pass the result as `is_weights` to policy_gradient_loss or ppo_clip_loss.
    TOKEN: one weight per token; SEQUENCE: one per sample, of the sequence ratio
    exp(sum_t mask (old - sampler)), for ppo_clip_loss(ratio_level=SEQUENCE).

    Args:
      old_logprobs: [B, N, T] float, the trainer's log-probs of the rollout (before update).
      sampler_logprobs: [B, N, T] float, the sampler's log-probs of the same tokens.
      mask: [B, N, T] bool. cap: static float > 0. ratio_level: RatioLevel (static).

    Returns:
      (weights [B, N, T] with 1 on padding, or [B, N] with SEQUENCE; metrics:
      tis_weight_mean, tis_truncated_fraction, sampler_kl (k3 estimate of
      KL(sampler || trainer) per token, or per sequence with SEQUENCE)).
    """
    old_logprobs, mask = _check_tokens(old_logprobs, mask)
    sampler_logprobs = _check_like(
        sampler_logprobs, "sampler_logprobs", old_logprobs, "old_logprobs"
    )
    if not (isinstance(cap, (int, float)) and cap > 0):
        raise ValueError(f"`cap` must be a positive float; got {cap!r}.")
    if not isinstance(ratio_level, RatioLevel):
        raise ValueError(f"`ratio_level` must be a RatioLevel; got {ratio_level!r}.")
    log_w = jnp.where(mask, _float(old_logprobs) - _float(sampler_logprobs), 0.0)
    log_w = jax.lax.stop_gradient(log_w)
    valid = mask
    if ratio_level is RatioLevel.SEQUENCE:
        log_w, valid = jnp.sum(log_w, axis=-1), jnp.any(mask, axis=-1)
    weights = jnp.exp(jnp.minimum(log_w, math.log(cap)))  # min before exp: no overflow
    clipped_log_w = jnp.clip(log_w, -20.0, 20.0)  # the metric only; keeps it finite
    metrics = {
        "tis_weight_mean": masked_mean(weights, valid),
        "tis_truncated_fraction": masked_mean(log_w > math.log(cap), valid),
        "sampler_kl": masked_mean(jnp.expm1(clipped_log_w) - clipped_log_w, valid),
    }
    return weights, metrics


def kl_estimate(logprobs: jax.Array, ref_logprobs: jax.Array, estimator: KLEstimator) -> jax.Array:
    """Per-token KL(pi || pi_ref) estimate at tokens y ~ pi; any shape, elementwise.

    ref_logprobs is a frozen reference: its gradient is stopped.
    """
    log_r = jax.lax.stop_gradient(_float(ref_logprobs)) - _float(logprobs)
    if estimator is KLEstimator.K1:
        return -log_r
    if estimator is KLEstimator.K2:
        return 0.5 * jnp.square(log_r)
    if estimator is KLEstimator.K3:
        return jnp.expm1(log_r) - log_r
    raise ValueError(f"`estimator` must be a KLEstimator; got {estimator!r}.")


def kl_penalty_loss(
    logprobs: jax.Array,
    ref_logprobs: jax.Array,
    mask: jax.Array,
    estimator: KLEstimator = KLEstimator.K3,
    aggregation: LossAggregation = LossAggregation.SEQ_MEAN_TOKEN_MEAN,
    *,
    max_len: int | None = None,
) -> tuple[jax.Array, Metrics]:
    """KL to a frozen reference policy: mean over B, N of agg_t kl_estimate (GRPO's penalty).

    With TOKEN_SUM, agg_t is the sequence-level KL estimate; SEQ_MEAN_TOKEN_MEAN is GRPO's
    per-token mean. K1 is refused: its gradient is zero in expectation (KLEstimator).

    Args:
      logprobs: [B, N, T] float, current policy at the sampled tokens (differentiated).
      ref_logprobs: [B, N, T] float, the reference policy at the same tokens.
      mask: [B, N, T] bool. estimator: KLEstimator K2 or K3. aggregation, max_len:
        reduction of T.

    Returns:
      (scalar KL, to be scaled by the caller's coefficient; metrics: kl (per-token mean of
      the estimator)).
    """
    if estimator is KLEstimator.K1:
        raise ValueError(
            "`estimator`=K1 is not a penalty: its expected gradient is 0 (Tang & Munos 2025); "
            "use KLEstimator.K3 or K2."
        )
    logprobs, mask = _check_tokens(logprobs, mask)
    ref_logprobs = _check_like(ref_logprobs, "ref_logprobs", logprobs, "logprobs")
    kl = kl_estimate(logprobs, jnp.where(mask, ref_logprobs, logprobs), estimator)
    loss = jnp.mean(aggregate_tokens(kl, mask, aggregation, max_len))
    return loss, {"kl": masked_mean(jax.lax.stop_gradient(kl), mask)}


def token_entropy(logits: jax.Array) -> jax.Array:
    """-sum_v p_v log p_v with p = softmax(logits): [..., V] -> [...]; -inf logits allowed."""
    logp = jax.nn.log_softmax(_float(logits), axis=-1)
    p = jnp.exp(logp)
    safe_logp = jnp.where(p > 0, logp, 0.0)  # 0 * -inf would be nan, in value and gradient
    return -jnp.sum(p * safe_logp, axis=-1)


def entropy_loss(
    entropy: jax.Array,
    mask: jax.Array,
    aggregation: LossAggregation = LossAggregation.SEQ_MEAN_TOKEN_MEAN,
    *,
    max_len: int | None = None,
) -> tuple[jax.Array, Metrics]:
    """Entropy bonus as a loss: -(mean over B, N of agg_t H_t); minimising it raises entropy.

    Args:
      entropy: [B, N, T] float, per-token entropies H_t of the policy (differentiated;
        token_entropy of logits, or kjax.rl.forward's chunked TokenStats.entropy).
      mask: [B, N, T] bool. aggregation, max_len: reduction of T.

    Returns:
      (scalar loss, metrics: entropy (per-token mean)).
    """
    entropy = _check_rank(entropy, "entropy", "[B, N, T]", 3, jnp.floating)
    mask = _check_like(mask, "mask", entropy, "entropy", jnp.bool_)
    loss = -jnp.mean(aggregate_tokens(_float(entropy), mask, aggregation, max_len))
    return loss, {"entropy": masked_mean(jax.lax.stop_gradient(entropy), mask)}


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(logits)[targets]: logits [..., T, V] float, targets [..., T] int -> [..., T]."""
    logp = jax.nn.log_softmax(_float(logits), axis=-1)
    return jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _check_sft(logits, targets, mask):
    logits = jnp.asarray(logits)
    if logits.ndim < 2 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"`logits` must be float [B, T, V]; got {logits.dtype}{logits.shape}.")
    targets = _check_like(targets, "targets", logits[..., 0], "logits[..., 0]", jnp.integer)
    mask = _check_like(mask, "mask", targets, "targets", jnp.bool_)
    return logits, targets, mask


def cross_entropy_loss(
    logits: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    aggregation: LossAggregation = LossAggregation.SEQ_MEAN_TOKEN_MEAN,
    *,
    max_len: int | None = None,
) -> tuple[jax.Array, Metrics]:
    """Masked SFT cross-entropy: mean over B of agg_t[-log p(target_t)].

    Args:
      logits: [B, T, V] float. targets: [B, T] int (next tokens). mask: [B, T] bool,
        True on the tokens to learn (the answer). Extra leading axes are allowed.
      aggregation: reduction of T; TOKEN_SUM gives -log p_hat of the whole answer.

    Returns:
      (scalar loss, metrics: ce_loss, token_accuracy).
    """
    logits, targets, mask = _check_sft(logits, targets, mask)
    nll = -token_logprobs(logits, targets)
    loss = jnp.mean(aggregate_tokens(nll, mask, aggregation, max_len))
    hit = jnp.argmax(logits, axis=-1) == targets
    return loss, {"ce_loss": loss, "token_accuracy": masked_mean(hit, mask)}


def _log1mexp(x: jax.Array) -> jax.Array:
    """log(1 - exp(x)) for x <= 0, accurate at both ends (Maechler 2012)."""
    return jnp.where(x > -math.log(2.0), jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


def dco_weight(seq_logprob: jax.Array, n: int) -> jax.Array:
    """F(N, p) = N p (1-p)^(N-1) / (1 - (1-p)^N) at p = exp(seq_logprob), in log space.

    F is the factor DCO puts on the cross-entropy gradient: 1 for small p, -> 0 as p -> 1.
    """
    s = jnp.minimum(_float(seq_logprob), 0.0)
    log_q = _log1mexp(s)  # log(1 - p)
    log_f = math.log(n) + s - _log1mexp(n * log_q)
    if n > 1:  # (1-p)^0 = 1 even at p = 1, where log_q = -inf
        log_f = log_f + (n - 1) * log_q
    return jnp.exp(log_f)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def dco_loss_from_seq_logprob(seq_logprob: jax.Array, n: int) -> jax.Array:
    """-log(1 - (1 - p)^N), p = exp(seq_logprob): any shape, elementwise; n static.

    The gradient w.r.t. seq_logprob is exactly -dco_weight (custom JVP, finite even at
    p = 1 where autodiff of the log-space form would give 0 * inf).
    """
    s = jnp.minimum(_float(seq_logprob), 0.0)
    return -_log1mexp(n * _log1mexp(s))


@dco_loss_from_seq_logprob.defjvp
def _dco_jvp(n, primals, tangents):
    (s,), (ds,) = primals, tangents
    return dco_loss_from_seq_logprob(s, n), -dco_weight(s, n) * _float(ds)


def dco_loss(
    logits: jax.Array, targets: jax.Array, mask: jax.Array, n: int
) -> tuple[jax.Array, Metrics]:
    """Confidence-limiting SFT loss (DCO) of Chen, Raventos et al. 2025, mean over B.

    Loss -log(1 - (1 - p_hat)^N): the log-probability that at least one of N samples is
    the reference answer, with p_hat = exp(sum_t mask log p(target_t)) the model's
    sequence probability. Its gradient is F(N, p_hat) * grad CE (dco_weight): it stops
    pushing p_hat towards 1 once pass@N is saturated. N = 1 is TOKEN_SUM cross-entropy.
    Reference: Chen, Raventos, Cheng, Ganguli & Druckmann 2025, "Rethinking fine-tuning
    when scaling test-time compute: limiting confidence improves mathematical reasoning".

    Args:
      logits: [B, T, V] float. targets: [B, T] int. mask: [B, T] bool (the answer tokens).
      n: static int >= 1, the number of samples drawn at test time.

    Returns:
      (scalar loss, metrics: dco_loss, dco_weight_mean, seq_logprob_mean).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a static int >= 1 (test-time samples); got {n!r}.")
    logits, targets, mask = _check_sft(logits, targets, mask)
    seq = jnp.sum(jnp.where(mask, token_logprobs(logits, targets), 0.0), axis=-1)
    loss = jnp.mean(dco_loss_from_seq_logprob(seq, n))
    seq_ng = jax.lax.stop_gradient(seq)
    metrics = {
        "dco_loss": loss,
        "dco_weight_mean": jnp.mean(dco_weight(seq_ng, n)),
        "seq_logprob_mean": jnp.mean(seq_ng),
    }
    return loss, metrics
