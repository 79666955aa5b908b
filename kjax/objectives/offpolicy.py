"""Off-policy max@k advantages (Bagirov et al. 2025, "The Best of N Worlds").

The math (docs/estimators.md section 4). The N samples of a group come from pi_old and
rho_l = pi_theta(y_l) / pi_old(y_l) = exp(log_ratio_l). Each estimator of section 2
written over k-subsets I becomes the importance-weighted subset average, whose gradient
is sum_i rho_i grad log pi_theta(y_i) A'_i with

    A'_i = (1/C(N,k)) sum_{|I|=k, i in I} (prod_{l in I \\ i} rho_l) (max_I r - b(I \\ i)),

b = 0 for S and b = max(I \\ i) for LOO_MINUS_ONE. L2O is S's A'_i minus
(k/N) m~_k(all but i), with m~_k(J) = (1/C(N-1,k)) sum_{K subset J, |K|=k}
(prod_{l in K} rho_l) max_K r. A subset's product of ratios makes its k draws
distributed as under pi_theta, so E_old[sum_i rho_i A'_i grad log pi_theta(y_i)] is
exactly grad J_k(pi_theta); the baselines do not depend on y_i and keep zero mean.
With rho = 1 each A' is the on-policy estimator. rho_i itself is the PPO ratio: the
trainer's surrogate is ratio_i * A'_i, clipped as configured.

Exact form (exact=True), O(N k) per group after one sort: classify each subset by its
top-ranked member; then every sum is over elementary symmetric polynomials of the
ratios below a rank, carried forward (and a reward-weighted twin carried backward) as
log means in one pass over the ranks each; formulas and numerics in `_offpolicy_exact`.
LOO_MINUS_ONE becomes a sum over reward gaps r_(m+1) - r_(m) >= 0 with positive weights.

The linear form (exact=False) replaces each product by its first-order expansion,
prod_{l in I \\ i} rho_l ~ 1 + sum_{l in I \\ i} delta_l with delta = rho - 1, which
turns every subset sum into prefix and suffix sums: O(N) after the sort (Bagirov et
al.'s weights without the sample's own delta, which the PPO ratio now carries; see
`_offpolicy_linear`). Its error is second order in delta.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kjax.objectives._offpolicy_exact import exact_sorted
from kjax.objectives._offpolicy_linear import linear_delta, linear_sorted
from kjax.objectives._validate import check_group, check_k, check_same_shape
from kjax.objectives.advantages import MaxAtKEstimator, sort_group

# The estimators written over k-subsets whose baseline does not depend on y_i.
SUPPORTED = (MaxAtKEstimator.S, MaxAtKEstimator.LOO_MINUS_ONE, MaxAtKEstimator.L2O)


def max_at_k_offpolicy_advantages(
    rewards: jax.Array,
    log_ratio: jax.Array,
    k: int,
    *,
    estimator: MaxAtKEstimator,
    exact: bool = True,
    clamp: float | None = None,
) -> jax.Array:
    """Off-policy max@k advantages A'_i, the weight of sample i's OWN ratio rho_i.

    sum_i rho_i A'_i grad log pi_theta(y_i), with y ~ pi_old, is unbiased for grad J_k at
    pi_theta (exact=True, clamp=None). The module docstring has the formulas.

    Args:
      rewards: [B, N] float.
      log_ratio: [B, N] float, log pi_theta(y) - log pi_old(y) per sample (sequence level).
      k: static int, 1 <= k <= N (L2O needs N > k). At k = 1, S is r_i / N (no other
        sample, so no ratio enters) and LOO_MINUS_ONE is L2O's k = 1 form,
        (r_i - mean_{j != i} rho_j r_j) / N: the on-policy RLOO / N at rho = 1.
      estimator: MaxAtKEstimator.S, LOO_MINUS_ONE or L2O (keyword only).
      exact: True: exact products of the others' ratios (elementary symmetric
        polynomials, O(N k) per group). False: their first-order expansion (O(N)).
      clamp: None, or c > 0. Truncates each ratio that enters the OTHERS' products
        (never the sample's own ratio): exact clips rho_l into [max(1-c, 0), 1+c];
        linear clips delta_l = rho_l - 1 into [-c, c]. Exact weights are products of
        positive ratios, so never negative. A linear weight 1 + sum of m deltas
        (m = k-1, or k for L2O's baseline) is kept >= 0 by also clipping delta_l
        >= -1/m, with or without clamp (the only truncation the linear form always does).

    Returns:
      [B, N] advantages under stop_gradient, in the rewards' dtype; equal to
      `max_at_k_advantages(rewards, k, estimator)` (to rounding) when log_ratio = 0.

    References: Bagirov et al. 2025; Walder & Karkhanis 2025 (PKPO); docs/estimators.md
      sections 2 and 4.
    """
    rewards = check_group(rewards, "rewards", "float")
    log_ratio = check_group(log_ratio, "log_ratio", "float")
    check_same_shape(rewards, "rewards", log_ratio, "log_ratio")
    n = rewards.shape[1]
    if estimator not in SUPPORTED:
        names = ", ".join(f"MaxAtKEstimator.{e.name}" for e in SUPPORTED)
        raise ValueError(
            f"`estimator` must be one of {names} (the estimators with an off-policy form); "
            f"got {estimator!r}. Use LOO_MINUS_ONE for the recommended estimator."
        )
    k = check_k(k, n)
    check_k(k, n, min_n=estimator.min_samples(k))  # L2O averages k-subsets of N-1 others
    if not isinstance(exact, bool):
        raise ValueError(f"`exact` must be a bool (True: exact products); got {exact!r}.")
    if clamp is not None and (
        isinstance(clamp, bool) or not isinstance(clamp, (int, float)) or not 0 < clamp < math.inf
    ):
        raise ValueError(f"`clamp` must be None or a finite float > 0 (e.g. 0.2); got {clamp!r}.")

    name = estimator.name
    if name == "LOO_MINUS_ONE" and k == 1:  # max over the empty set is undefined
        if n == 1:
            return jnp.zeros_like(rewards)  # a lone sample has no leave-one-out baseline
        name = "L2O"
    if name == "S" and k == 1:  # no other sample enters a 1-subset: on-policy r_i / N
        return jax.lax.stop_gradient(rewards / n)

    dtype = rewards.dtype
    log_ratio = jax.lax.stop_gradient(log_ratio.astype(dtype))
    r, order, inverse = sort_group(jax.lax.stop_gradient(rewards))
    lr = jnp.take_along_axis(log_ratio, order, axis=-1)
    if exact:
        adv = exact_sorted(r, lr, k, name, clamp)
    else:
        adv = linear_sorted(r, linear_delta(lr, k, name, clamp), k, name)
    return jax.lax.stop_gradient(jnp.take_along_axis(adv, inverse, axis=-1))
