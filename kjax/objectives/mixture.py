"""Mixtures of max@k objectives over k, and MaxRL's truncated maximum likelihood.

J = sum_k w_k J_k with w_k >= 0 has the unbiased advantage sum_k w_k A^(k) for any
unbiased per-k estimator (docs/estimators.md section 2). MaxRL (Tajwar, Zeng et al. 2026)
maximises J_T = -sum_{k<=T} (1-p)^k / k on binary rewards, whose gradient is
sum_{k<=T} (1/k) grad pass@k: the mixture with w_k = 1/k (T -> infinity: grad log p).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import jax

from kjax.objectives._validate import check_group, check_weights
from kjax.objectives.advantages import MaxAtKEstimator, sorted_advantages


def maxrl_weights(t: int) -> dict[int, float]:
    """{k: 1/k for k = 1..T}: the mixture whose gradient is MaxRL's grad J_T.

    J_T = -sum_{k<=T} (1-p)^k / k (Tajwar, Zeng et al. 2026, "Maximum Likelihood RL");
    d/dp (1-p)^k / k = -(1-p)^(k-1) = -(1/k) d/dp pass@k. Needs N >= T samples per prompt
    (N > T for LOO and L2O).
    """
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
        raise ValueError(f"`T` (maxrl_weights) must be a static int >= 1; got {t!r}.")
    return {k: 1.0 / k for k in range(1, int(t) + 1)}


def max_at_k_mixture_advantages(
    rewards: jax.Array,
    weights: Mapping[int, float],
    *,
    estimator: MaxAtKEstimator = MaxAtKEstimator.LOO_MINUS_ONE,
) -> jax.Array:
    """Advantages of sum_k w_k max@k: sum_k w_k max_at_k_advantages(rewards, k, estimator).

    One sort and one pass of prefix/suffix sums for all k together: the per-k tables are
    float64 constants of (N, k), summed with the weights on the host. Unbiased for
    sum_k w_k grad J_k with S, LOO, L2O and LOO_MINUS_ONE; CENTERED centres the sum.

    Args:
      rewards: [B, N] float.
      weights: {k: w_k}, static ints k with N >= k (N > k for LOO and L2O) and finite
        w_k >= 0; e.g. maxrl_weights(T) or {1: 0.5, 8: 1.0}.
      estimator: the per-k MaxAtKEstimator; CHEN_ANALYTIC (normalised per k by its own
        sigma, so a weighted sum has no objective) is rejected.

    Returns:
      [B, N] advantages under stop_gradient, in the rewards' dtype.

    Example:
      >>> max_at_k_mixture_advantages(rewards, maxrl_weights(8))  # MaxRL with T = 8
    """
    rewards = check_group(rewards, "rewards", "float")
    if not isinstance(estimator, MaxAtKEstimator):
        raise ValueError(f"`estimator` must be a MaxAtKEstimator; got {estimator!r}.")
    if estimator is MaxAtKEstimator.CHEN_ANALYTIC:
        raise ValueError(
            "`estimator`=CHEN_ANALYTIC cannot be mixed over k: each k is divided by its own "
            "sigma, so the sum is the gradient of no objective. Use LOO_MINUS_ONE or L2O."
        )
    table = check_weights(weights, rewards.shape[1], estimator.min_samples)
    return sorted_advantages(rewards, table, estimator)
