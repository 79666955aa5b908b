"""Off-policy max@k advantages (Bagirov et al. 2025, "The Best of N Worlds").

Samples come from pi_old; rho_j = pi_theta(y_j) / pi_old(y_j) = 1 + delta_j. Each
k-subset's importance weight prod_{l in I} rho_l is linearised to 1 + sum_{l in I} delta_l,
so A_i = (1/C(N,k)) sum_{|I|=k, i in I} max_I r * (1 + sum_{l in I} delta_l). With
delta = 0 this is PKPO's unbiased `s`. The paper's listing is O(N^2) per prompt; after
one sort, prefix and suffix sums make it O(N).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kjax.objectives import binomial
from kjax.objectives._validate import check_group, check_k, check_same_shape
from kjax.objectives.advantages import prefix_sum_exclusive, sort_group, suffix_sum_exclusive


def max_at_k_offpolicy_advantages(
    rewards: jax.Array, log_ratio: jax.Array, k: int, clamp: float = 0.2
) -> jax.Array:
    """First-order off-policy max@k advantages (Bagirov et al. 2025, section 4 of ESTIMATORS.md).

    On sorted rewards, with delta clamped to [-clamp, clamp] and D_i = sum_{l<i} delta_l:
      w'_ii = C(i-1,k-1)(1+delta_i) + C(i-2,k-2) D_i                       (i >= k)
      w'_ij = C(j-2,k-2)(1+delta_i+delta_j) + C(j-3,k-3)(D_j - delta_i)    (j > i)
      A_i   = sum_j w'_ij r_(j) / C(N,k).

    Args:
      rewards: [B, N] float.
      log_ratio: [B, N] float, log pi_theta(y) - log pi_old(y) per sample (sequence level).
      k: static int, 1 <= k <= N.
      clamp: c > 0; delta = exp(log_ratio) - 1 is clipped to [-c, c] (a trust region).

    Returns:
      [B, N] advantages under stop_gradient; equal to MaxAtKEstimator.S when log_ratio = 0.
    """
    rewards = check_group(rewards, "rewards", "float")
    log_ratio = check_group(log_ratio, "log_ratio", "float")
    check_same_shape(rewards, "rewards", log_ratio, "log_ratio")
    n = rewards.shape[1]
    k = check_k(k, n)
    if not (isinstance(clamp, (int, float)) and clamp > 0):
        raise ValueError(f"`clamp` must be a positive float (e.g. 0.2); got {clamp!r}.")

    dtype = rewards.dtype
    delta = jnp.clip(jnp.expm1(log_ratio.astype(dtype)), -clamp, clamp)
    r, order, inverse = sort_group(rewards)
    d = jnp.take_along_axis(delta, order, axis=-1)
    below = prefix_sum_exclusive(d)  # D_i

    pos = np.arange(1, n + 1)
    alpha = jnp.asarray(binomial.comb_ratio(pos - 1, k - 1, n, k), dtype)
    beta = jnp.asarray(binomial.comb_ratio(pos - 2, k - 2, n, k), dtype)
    gamma = jnp.asarray(binomial.comb_ratio(pos - 3, k - 3, n, k), dtype)

    own = (alpha * (1.0 + d) + beta * below) * r
    above = suffix_sum_exclusive((beta * (1.0 + d) + gamma * below) * r)
    above = above + d * suffix_sum_exclusive((beta - gamma) * r)
    adv = jnp.take_along_axis(own + above, inverse, axis=-1)
    return jax.lax.stop_gradient(adv)
