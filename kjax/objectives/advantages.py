"""Per-sample advantages for the mean objective (k = 1) and for max@k / pass@k.

Convention. `mean_advantages` follows the peers (RLOO, GRPO, Dr.GRPO): the policy
gradient is (1/N) sum_i A_i grad log pi(y_i). The k-sample estimators follow PKPO and
Tang et al.: the gradient is sum_i A_i grad log pi(y_i), unbiased for grad J_k with
J_k = E[max of k samples]. Binary pass@k is max@k on {0, 1} rewards. All outputs are
[B, N] under stop_gradient. The math and its sources: shared/design/ESTIMATORS.md.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np

from kjax.objectives import binomial
from kjax.objectives._validate import check_group, check_k


class MeanBaseline(enum.Enum):
    """Baselines for the single-sample (k = 1) objective."""

    RLOO = "rloo"  # r_i - mean_{j != i} r_j; unbiased (Kool et al. 2019; Ahmadian et al. 2024).
    GROUP_MEAN = "group_mean"  # r_i - mean_j r_j; Dr.GRPO (Liu et al. 2025).
    GROUP_ZSCORE = "group_zscore"  # (r_i - mean) / (std + eps); GRPO (Shao et al. 2024), biased.


class MaxAtKEstimator(enum.Enum):
    """Estimators of grad max@k (pass@k on binary rewards); see ESTIMATORS.md section 2."""

    S = "s"  # No baseline; unbiased (PKPO Thm 4).
    LOO = "loo"  # s minus k/(N-1) * max@k of the other samples; unbiased; needs N > k.
    LOO_MINUS_ONE = "loo_minus_one"  # PKPO eq. 33; unbiased; Tang et al.'s LOO at N == k.
    CENTERED = "centered"  # LOO_MINUS_ONE minus its group mean; Tang et al.'s biased variant.
    CHEN_ANALYTIC = "chen_analytic"  # Chen et al. 2025 analytic pass@k advantage; binary only.


_ZSCORE_EPS = 1e-6


def mean_advantages(rewards: jax.Array, baseline: MeanBaseline = MeanBaseline.RLOO) -> jax.Array:
    """Advantages for the mean reward (the k = 1 family and the peers' baselines).

    Args:
      rewards: [B, N] float.
      baseline: which baseline to subtract (an enum, validated).

    Returns:
      [B, N] float advantages under stop_gradient. RLOO needs N >= 2.
    """
    rewards = check_group(rewards, "rewards", "float")
    n = rewards.shape[1]
    mean = jnp.mean(rewards, axis=-1, keepdims=True)
    if baseline is MeanBaseline.RLOO:
        check_k(2, n, name="N for the RLOO baseline")
        adv = (rewards - mean) * (n / (n - 1))  # == r_i - mean_{j != i} r_j
    elif baseline is MeanBaseline.GROUP_MEAN:
        adv = rewards - mean
    elif baseline is MeanBaseline.GROUP_ZSCORE:
        std = jnp.std(rewards, axis=-1, keepdims=True)
        adv = (rewards - mean) / (std + _ZSCORE_EPS)
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


def _const(table, dtype) -> jax.Array:
    return jnp.asarray(table, dtype=dtype)


def _s_sorted(r_sorted: jax.Array, n: int, k: int) -> jax.Array:
    """s at each sorted position p: [C(p-1,k-1) r_(p) + sum_{j>p} C(j-2,k-2) r_(j)] / C(n,k)."""
    pos = np.arange(1, n + 1)
    own = _const(binomial.max_at_k_weights(n, k), r_sorted.dtype)
    above = _const(binomial.comb_ratio(pos - 2, k - 2, n, k), r_sorted.dtype)
    return own * r_sorted + suffix_sum_exclusive(above * r_sorted)


def _loo_minus_one_sorted(r_sorted: jax.Array, n: int, k: int) -> jax.Array:
    """[C(p-1,k-1) r_(p) - sum_{j<p} C(j-1,k-2) r_(j)] / C(n,k), for k >= 2.

    By the hockey-stick identity C(p-1,k-1) = sum_{j<p} C(j-1,k-2), so this equals
    sum_{j<p} C(j-1,k-2) (r_(p) - r_(j)) / C(n,k) >= 0 and is invariant to shifting the
    rewards. Shifting by the group's top reward keeps float32 cancellation small.
    """
    pos = np.arange(1, n + 1)
    own = _const(binomial.max_at_k_weights(n, k), r_sorted.dtype)
    below = _const(binomial.comb_ratio(pos - 1, k - 2, n, k), r_sorted.dtype)
    shifted = r_sorted - r_sorted[..., -1:]
    adv = own * shifted - prefix_sum_exclusive(below * shifted)
    return jnp.maximum(adv, 0.0)  # exact value is >= 0; clip only rounding error


def _loo_sorted(r_sorted: jax.Array, n: int, k: int) -> jax.Array:
    """s - k/(n-1) * max@k of the other n-1 samples, for n > k (PKPO eq. 29-32)."""
    w_rest = _const(binomial.max_at_k_weights(n - 1, k), r_sorted.dtype)  # [n-1]
    zero = jnp.zeros((1,), r_sorted.dtype)
    # Removing sorted position p moves r_(j) to rank j for j < p and to rank j-1 for j > p.
    rank_same = jnp.concatenate([w_rest, zero])  # weight of r_(j) if j < p
    rank_down = jnp.concatenate([zero, w_rest])  # weight of r_(j) if j > p
    m_rest = prefix_sum_exclusive(rank_same * r_sorted) + suffix_sum_exclusive(rank_down * r_sorted)
    return _s_sorted(r_sorted, n, k) - (k / (n - 1)) * m_rest


def _chen_analytic(rewards: jax.Array, n: int, k: int) -> jax.Array:
    """Chen et al. 2025 (Pass@k Training) analytic advantage for {0, 1} rewards."""
    c = jnp.round(jnp.sum(rewards, axis=-1)).astype(jnp.int32)  # [B]
    cs = np.arange(n + 1)  # host-side float64 tables over c = 0..n correct
    big_r = binomial.pass_at_k_table(n, k)
    sigma = np.sqrt(np.clip(big_r * (1.0 - big_r), 0.0, None))
    miss = np.exp(binomial.log_comb(n - cs - 1, k - 1) - binomial.log_comb(n - 1, k - 1))
    safe = np.where(sigma > 0, sigma, 1.0)
    pos_tab = np.where(sigma > 0, (1.0 - big_r) / safe, 0.0)
    neg_tab = np.where(sigma > 0, (1.0 - big_r - miss) / safe, 0.0)
    pos = _const(pos_tab, rewards.dtype)[c][:, None]
    neg = _const(neg_tab, rewards.dtype)[c][:, None]
    return jnp.where(rewards > 0.5, pos, neg)


def max_at_k_advantages(
    rewards: jax.Array,
    k: int,
    estimator: MaxAtKEstimator = MaxAtKEstimator.LOO_MINUS_ONE,
) -> jax.Array:
    """Per-sample advantages whose score-function gradient targets max@k (pass@k if binary).

    sum_i A_i grad log pi(y_i) is unbiased for grad E[max of k samples] for S, LOO and
    LOO_MINUS_ONE; CENTERED has expectation (1 - k/N) grad J_k + (k/N) grad J_{k-1}
    (exactly grad J_{k-1} at N == k); CHEN_ANALYTIC is a normalized, biased advantage.
    O(N log N) per group: one sort, prefix/suffix sums, constant float64 weights.

    Args:
      rewards: [B, N] float. For CHEN_ANALYTIC, values must be in {0, 1}.
      k: static int, 1 <= k <= N (LOO needs N > k). For k = 1, LOO_MINUS_ONE and
        CENTERED are RLOO in this module's sum convention: (r_i - mean_{j != i} r_j) / N.
      estimator: a MaxAtKEstimator.

    Returns:
      [B, N] advantages under stop_gradient, in the rewards' dtype.

    References: Walder & Karkhanis 2025 (PKPO); Tang, Zheng, Synnaeve & Munos 2025;
      Chen et al. 2025 (Pass@k Training).
    """
    rewards = check_group(rewards, "rewards", "float")
    n = rewards.shape[1]
    if not isinstance(estimator, MaxAtKEstimator):
        raise ValueError(f"`estimator` must be a MaxAtKEstimator; got {estimator!r}.")
    k = check_k(k, n, min_n=k + 1 if estimator is MaxAtKEstimator.LOO else None)

    if estimator is MaxAtKEstimator.CHEN_ANALYTIC:
        _check_binary_if_concrete(rewards)
        return jax.lax.stop_gradient(_chen_analytic(rewards, n, k))
    if k == 1 and estimator in (MaxAtKEstimator.LOO_MINUS_ONE, MaxAtKEstimator.CENTERED):
        if n == 1:
            return jnp.zeros_like(rewards)  # a lone sample has no leave-one-out baseline
        return mean_advantages(rewards, MeanBaseline.RLOO) / n

    r_sorted, _, inverse = sort_group(rewards)
    if estimator is MaxAtKEstimator.S:
        adv_sorted = _s_sorted(r_sorted, n, k)
    elif estimator is MaxAtKEstimator.LOO:
        adv_sorted = _loo_sorted(r_sorted, n, k)
    else:
        adv_sorted = _loo_minus_one_sorted(r_sorted, n, k)
    adv = jnp.take_along_axis(adv_sorted, inverse, axis=-1)
    if estimator is MaxAtKEstimator.CENTERED:
        adv = adv - jnp.mean(adv, axis=-1, keepdims=True)
    return jax.lax.stop_gradient(adv)


def _check_binary_if_concrete(rewards: jax.Array) -> None:
    """Raises if concrete rewards are not in {0, 1}; traced values cannot be checked."""
    if isinstance(rewards, jax.core.Tracer):
        return
    if not bool(jnp.all((rewards == 0) | (rewards == 1))):
        raise ValueError(
            "`rewards` must be binary (0 or 1) for MaxAtKEstimator.CHEN_ANALYTIC; use "
            "LOO_MINUS_ONE for continuous rewards."
        )
