"""Per-sample advantages for the mean objective (k = 1) and for max@k / pass@k.

Convention. `mean_advantages` follows the peers (RLOO, GRPO, Dr.GRPO): the policy
gradient is (1/N) sum_i A_i grad log pi(y_i). The k-sample estimators follow PKPO and
Tang et al.: the gradient is sum_i A_i grad log pi(y_i), unbiased for grad J_k with
J_k = E[max of k samples]. Binary pass@k is max@k on {0, 1} rewards. All outputs are
[B, N] under stop_gradient. The math and its sources: docs/estimators.md.

"Centred" means one thing throughout kjax: the advantage minus its own group mean
(`CENTERED` here, `centered=True` in `majority`). What differs at k = 1 is the
advantage being centred; see `MaxAtKEstimator.CENTERED`.
"""

from __future__ import annotations

import enum
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kjax.objectives import binomial
from kjax.objectives._validate import check_group, check_k
from kjax.objectives.shrinkage_mean import mean_shrinkage_advantages


class MeanBaseline(enum.Enum):
    """Baselines for the single-sample (k = 1) objective."""

    RLOO = "rloo"  # r_i - mean_{j != i} r_j; unbiased (Kool et al. 2019; Ahmadian et al. 2024).
    GROUP_MEAN = "group_mean"  # r_i - mean_j r_j; Dr.GRPO (Liu et al. 2025).
    GROUP_ZSCORE = "group_zscore"  # (r_i - mean) / (std + eps); GRPO (Shao et al. 2024), biased.
    # r_bi - [(1 - lam_b) mean_{j != i} r_bj + lam_b M_b], M_b and lam_b from the *other*
    # prompts of the batch: RLOO shrunk James-Stein style toward the batch; unbiased, needs
    # N >= 2; B <= 2 is RLOO (Zeng, Zhou, Arora & Zanette 2025; kjax.objectives.shrinkage).
    SHRINKAGE = "shrinkage"


class MaxAtKEstimator(enum.Enum):
    """Estimators of grad max@k (pass@k on binary rewards); see docs/estimators.md section 2.

    S, LOO, L2O and LOO_MINUS_ONE are unbiased. L2O and LOO_MINUS_ONE are the ones to
    use: shift-invariant, zero on an all-equal group, and equal to RLOO / N at k = 1.

    CENTERED is LOO_MINUS_ONE minus its group mean (Tang et al.'s biased variant). For
    k >= 2 its expectation is (1 - k/N) grad J_k + (k/N) grad J_{k-1} (grad J_{k-1} at
    N == k). At k = 1 LOO_MINUS_ONE is RLOO / N, whose group mean is already 0, so
    CENTERED is RLOO / N too and unbiased: the formula above does not apply. (The maj@k
    `centered=True` at k = 1 centres f(y_i) / N instead, an empty vote scoring 0, and so
    is Dr.GRPO / N with expectation (1 - 1/N) grad J_1; max over an empty set has no
    such value.)
    """

    S = "s"  # No baseline; unbiased (PKPO Thm 4).
    # PKPO eq. 29-32 as published: s_i - k/(N-1) * m_k(others); unbiased; needs N > k.
    # Unlike L2O (coefficient k/N) it is not centred, not shift-invariant, not RLOO at k = 1.
    LOO = "loo"
    # m_k(all N) - m_k(all but i) = s_i - (k/N) m_k(others): exactly centred (sums to 0),
    # shift-invariant, RLOO / N at k = 1; unbiased; needs N > k (Takashiro et al. 2026, MaxPO).
    L2O = "l2o"
    LOO_MINUS_ONE = "loo_minus_one"  # PKPO eq. 33; unbiased; >= 0; Tang et al.'s LOO at N == k.
    CENTERED = "centered"  # LOO_MINUS_ONE minus its group mean; biased for k >= 2 (see above).
    CHEN_ANALYTIC = "chen_analytic"  # Chen et al. 2025 analytic pass@k advantage; binary only.

    def min_samples(self, k: int) -> int:
        """The smallest group size N this estimator accepts for a given k."""
        return k + 1 if self in (MaxAtKEstimator.LOO, MaxAtKEstimator.L2O) else k


_ZSCORE_EPS = 1e-6


def mean_advantages(rewards: jax.Array, baseline: MeanBaseline = MeanBaseline.RLOO) -> jax.Array:
    """Advantages for the mean reward (the k = 1 family and the peers' baselines).

    Args:
      rewards: [B, N] float.
      baseline: which baseline to subtract (an enum, validated).

    Returns:
      [B, N] float advantages under stop_gradient. RLOO and SHRINKAGE need N >= 2. An
      all-equal group gives exactly 0 for every baseline but SHRINKAGE, also in float32;
      SHRINKAGE couples the prompts (an all-equal group moves toward the others' mean, an
      all-equal batch gives exactly 0) and gives every row NaN if any reward is NaN (B >= 3).
    """
    rewards = check_group(rewards, "rewards", "float")
    n = rewards.shape[1]
    if baseline is MeanBaseline.SHRINKAGE:
        check_k(2, n, name="N for the SHRINKAGE baseline")
        return jax.lax.stop_gradient(mean_shrinkage_advantages(rewards))
    # Every baseline is shift-invariant; shifting by a member of the group first makes an
    # all-equal group exactly 0 (the float32 mean of 0.1 repeated is not exactly 0.1, and
    # GRPO would divide that rounding error by a std of the same size).
    shifted = rewards - rewards[:, :1]
    centred = shifted - jnp.mean(shifted, axis=-1, keepdims=True)
    if baseline is MeanBaseline.RLOO:
        check_k(2, n, name="N for the RLOO baseline")
        adv = centred * (n / (n - 1))  # == r_i - mean_{j != i} r_j
    elif baseline is MeanBaseline.GROUP_MEAN:
        adv = centred
    elif baseline is MeanBaseline.GROUP_ZSCORE:
        adv = centred / (jnp.std(shifted, axis=-1, keepdims=True) + _ZSCORE_EPS)
    else:
        raise ValueError(f"`baseline` must be a MeanBaseline; got {baseline!r}.")
    return jax.lax.stop_gradient(adv)


def sort_group(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sorts each group ascending: returns (x_sorted [B,N], order [B,N], inverse [B,N]).

    x_sorted = take(x, order) and x = take(x_sorted, inverse). Every estimator here is
    invariant to how ties are ordered, so any stable order will do.
    """
    order = jnp.argsort(x, axis=-1, stable=True)
    return jnp.take_along_axis(x, order, axis=-1), order, jnp.argsort(order, axis=-1)


def suffix_sum_exclusive(x: jax.Array) -> jax.Array:
    """out[..., p] = sum_{j > p} x[..., j] (no subtraction, so no cancellation)."""
    incl = jnp.flip(jnp.cumsum(jnp.flip(x, -1), axis=-1), -1)
    return jnp.concatenate([incl[..., 1:], jnp.zeros_like(incl[..., :1])], axis=-1)


def prefix_sum_exclusive(x: jax.Array) -> jax.Array:
    """out[..., p] = sum_{j < p} x[..., j]."""
    incl = jnp.cumsum(x, axis=-1)
    return jnp.concatenate([jnp.zeros_like(incl[..., :1]), incl[..., :-1]], axis=-1)


Weights = tuple[tuple[int, float], ...]  # ((k, w_k), ...): hashable, validated by the caller


_TABLES = {
    MaxAtKEstimator.S: binomial.s_linear_weights,  # (own, below, above) [N]
    MaxAtKEstimator.LOO: binomial.loo_linear_weights,
    MaxAtKEstimator.L2O: binomial.l2o_gap_weights,  # (lower, upper) [N-1]
    MaxAtKEstimator.LOO_MINUS_ONE: binomial.loo_minus_one_gap_weights,
    MaxAtKEstimator.CENTERED: binomial.loo_minus_one_gap_weights,
}


@functools.lru_cache(maxsize=256)
def _tables(n: int, weights: Weights, estimator: MaxAtKEstimator) -> tuple[np.ndarray, ...]:
    """sum_k w_k (the estimator's tables at k), slot by slot, float64 on the host."""
    per_k = [_TABLES[estimator](n, k) for k, _ in weights]
    return tuple(
        sum(w * t[slot] for (_, w), t in zip(weights, per_k, strict=True))
        for slot in range(len(per_k[0]))
    )


def sorted_advantages(rewards: jax.Array, weights: Weights, estimator: MaxAtKEstimator):
    """sum_k w_k A^(k) [B, N] after one sort, for every estimator but CHEN_ANALYTIC.

    Each estimator's A^(k) at sorted rank p is a fixed linear form in the sorted rewards
    whose coefficients depend on (N, k) but not on p beyond "below p / at p / above p",
    so a sum over k is a sum of float64 tables and costs one pass. The shift-invariant
    estimators use the gaps r_(g+1) - r_(g) (binomial.*_gap_weights): ties contribute
    exactly 0 and float32 rounding is relative to the advantage, not to the rewards.
    Arguments are validated by the callers (static N, each k, weights >= 0).
    """
    n = rewards.shape[1]
    dtype = rewards.dtype
    r, _, inverse = sort_group(rewards)
    if estimator in (MaxAtKEstimator.S, MaxAtKEstimator.LOO):
        own, below, above = _tables(n, weights, estimator)
        adv = jnp.asarray(own, dtype) * r + suffix_sum_exclusive(jnp.asarray(above, dtype) * r)
        if np.any(below):
            adv = adv + prefix_sum_exclusive(jnp.asarray(below, dtype) * r)
    else:
        lower, upper = _tables(n, weights, estimator)
        gaps = r[:, 1:] - r[:, :-1]  # [B, N-1], >= 0
        zero = jnp.zeros_like(r[:, :1])
        adv = jnp.concatenate([zero, jnp.cumsum(jnp.asarray(lower, dtype) * gaps, axis=-1)], -1)
        if np.any(upper):  # sum over gaps g >= p
            up = jnp.flip(jnp.cumsum(jnp.flip(jnp.asarray(upper, dtype) * gaps, -1), -1), -1)
            adv = adv + jnp.concatenate([up, zero], axis=-1)
    adv = jnp.take_along_axis(adv, inverse, axis=-1)
    if estimator is MaxAtKEstimator.CENTERED:
        adv = adv - jnp.mean(adv, axis=-1, keepdims=True)
    return jax.lax.stop_gradient(adv)


def _chen_analytic(rewards: jax.Array, n: int, k: int) -> jax.Array:
    """Chen et al. 2025 (Pass@k Training) analytic advantage; NaN rows unless {0, 1}."""
    is_one = rewards == 1
    binary = jnp.all(is_one | (rewards == 0), axis=-1, keepdims=True)  # NaN is neither
    c = jnp.sum(is_one, axis=-1, dtype=jnp.int32)  # [B]
    cs = np.arange(n + 1)  # host-side float64 tables over c = 0..n correct
    big_r = binomial.pass_at_k_table(n, k)
    sigma = np.sqrt(np.clip(big_r * (1.0 - big_r), 0.0, None))
    miss = np.exp(binomial.log_comb(n - cs - 1, k - 1) - binomial.log_comb(n - 1, k - 1))
    safe = np.where(sigma > 0, sigma, 1.0)
    pos_tab = np.where(sigma > 0, (1.0 - big_r) / safe, 0.0)
    neg_tab = np.where(sigma > 0, (1.0 - big_r - miss) / safe, 0.0)
    pos = jnp.asarray(pos_tab, rewards.dtype)[c][:, None]
    neg = jnp.asarray(neg_tab, rewards.dtype)[c][:, None]
    return jnp.where(binary, jnp.where(is_one, pos, neg), jnp.nan)


def max_at_k_advantages(
    rewards: jax.Array,
    k: int,
    estimator: MaxAtKEstimator = MaxAtKEstimator.LOO_MINUS_ONE,
) -> jax.Array:
    """Per-sample advantages whose score-function gradient targets max@k (pass@k if binary).

    sum_i A_i grad log pi(y_i) is unbiased for grad E[max of k samples] for S, LOO, L2O
    and LOO_MINUS_ONE; CENTERED is biased for k >= 2 (see MaxAtKEstimator);
    CHEN_ANALYTIC is a normalized, biased advantage, ((N-k)/k) L2O / sigma on binary
    rewards. O(N log N) per group: one sort, prefix/suffix sums, float64 constant tables.

    Args:
      rewards: [B, N] float. For CHEN_ANALYTIC, values must be in {0, 1}: eagerly any
        other value raises; under jit (where values cannot be checked) a group with any
        value other than 0 or 1 gets NaN advantages, as does a group with a NaN reward.
      k: static int, 1 <= k <= N (LOO and L2O need N > k). At k = 1, L2O, LOO_MINUS_ONE
        and CENTERED are RLOO in this module's sum convention: (r_i - mean_{j != i} r_j) / N.
      estimator: a MaxAtKEstimator.

    Returns:
      [B, N] advantages under stop_gradient, in the rewards' dtype. NaN rewards give NaN.

    References: Walder & Karkhanis 2025 (PKPO); Tang, Zheng, Synnaeve & Munos 2025;
      Chen et al. 2025 (Pass@k Training); Takashiro et al. 2026 (MaxPO).
    """
    rewards = check_group(rewards, "rewards", "float")
    n = rewards.shape[1]
    if not isinstance(estimator, MaxAtKEstimator):
        raise ValueError(f"`estimator` must be a MaxAtKEstimator; got {estimator!r}.")
    k = check_k(k, n)
    check_k(k, n, min_n=estimator.min_samples(k))
    if estimator is MaxAtKEstimator.CHEN_ANALYTIC:
        _check_binary_if_concrete(rewards)
        return jax.lax.stop_gradient(_chen_analytic(rewards, n, k))
    return sorted_advantages(rewards, ((k, 1.0),), estimator)


def _check_binary_if_concrete(rewards: jax.Array) -> None:
    """Raises if concrete rewards hold a value other than 0, 1 or NaN (NaN propagates)."""
    if isinstance(rewards, jax.core.Tracer):
        return  # under jit `_chen_analytic` returns NaN rows for non-binary groups instead
    if not bool(jnp.all((rewards == 0) | (rewards == 1) | jnp.isnan(rewards))):
        raise ValueError(
            "`rewards` must be binary (0 or 1) for MaxAtKEstimator.CHEN_ANALYTIC; use "
            "LOO_MINUS_ONE or L2O for continuous rewards."
        )


def maxrl_practical_advantages(rewards: jax.Array) -> jax.Array:
    """MaxRL's per-group form (SkyRL, prime-rl): (r_i - mean r) / mean r, 0 if mean r = 0.

    In the mean convention of `mean_advantages` (divide by N for kjax's sum convention).
    How it relates to kjax's MaxRL, the truncated mixture `maxrl_weights(T)` with
    J_T = -sum_{k<=T} (1-p)^k / k (docs/estimators.md section 2.12):

    - Binary rewards, exactly in expectation: E[(1/N) sum_i A_i grad log pi(y_i)] =
      grad J_{N-1} = sum_{k<N} (1/k) grad pass@k = pass@(N-1) grad log p. So it is MaxRL at
      T = N - 1 (what `max_at_k_mixture_advantages(r, maxrl_weights(N - 1))` estimates
      without bias), with no per-prompt rescaling. Against the T -> infinity limit grad
      log p it differs by the per-prompt factor pass@(N-1) = 1 - (1-p)^(N-1) < 1, which
      weights hard prompts down; the two agree only as N -> infinity. (Without the "- 1",
      the mean of the correct samples' scores is unbiased for grad J_N.)
    - Binary rewards, sample by sample: A / N equals the CENTERED mixture with weights
      1/k for k = 2..N plus Dr.GRPO / N for k = 1, i.e.
      `max_at_k_mixture_advantages(r, {k: 1/k for k in 2..N}, estimator=CENTERED)
      + mean_advantages(r, GROUP_MEAN) / N`; CENTERED's bias (section 2.7) is what turns
      T = N into T = N - 1.
    - Continuous rewards: no such identity. (1/N) sum_i (r_i / mean r - 1) grad log pi(y_i)
      is a ratio of two sample means, a plug-in for grad log E[r] that is biased at finite
      N, while the kjax mixture targets sum_k w_k grad E[max of k] (best-of-k, not the log
      of the mean).

    Args:
      rewards: [B, N] float, every value >= 0 (the ratio needs a positive mean). Eagerly a
        negative value raises; under jit a group with a negative value gets NaN.

    Returns:
      [B, N] advantages under stop_gradient; an all-equal group gives exactly 0.
    """
    rewards = check_group(rewards, "rewards", "float")
    if not isinstance(rewards, jax.core.Tracer) and bool(jnp.any(rewards < 0)):
        raise ValueError(
            "`rewards` must be >= 0 for maxrl_practical_advantages (it divides by the group "
            "mean); shift or clip the rewards first."
        )
    mean = jnp.mean(rewards, axis=-1, keepdims=True)
    shifted = rewards - rewards[:, :1]  # exact zeros for an all-equal group, as above
    centred = shifted - jnp.mean(shifted, axis=-1, keepdims=True)
    zero = mean == 0  # a NaN mean stays NaN
    adv = jnp.where(zero, 0.0, centred / jnp.where(zero, 1.0, mean))
    negative = jnp.any(rewards < 0, axis=-1, keepdims=True)
    return jax.lax.stop_gradient(jnp.where(negative, jnp.nan, adv))
