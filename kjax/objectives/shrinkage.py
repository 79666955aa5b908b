"""Shrinkage baselines: each prompt's leave-one-out baseline pulled toward the other prompts.

Zeng, Zhou, Arora & Zanette 2025 ("Shrinking the Variance: Shrinkage Baselines for RL
with Verifiable Rewards") replace RLOO's per-prompt baseline by a James-Stein mix of the
prompt's own leave-one-out mean and the mean of the other prompts of the batch. Only the
abstract and the authors' released code (JSPO) could be read while this was written;
the estimator below is derived here and checked by enumeration. kjax applies the idea to
every estimator whose baseline is a leave-one-out statistic of the prompt's group: the
mean objective (`MeanBaseline.SHRINKAGE` in `mean_advantages`) and max@k's LOO, L2O and
LOO_MINUS_ONE (`shrink_max_at_k_advantages`). docs/estimators.md section 2.11.

What is unbiased. Sample i of prompt b gets the baseline

    (1 - lam_b) L_bi + lam_b M_b,

where L_bi is the estimator's own leave-one-out statistic (from prompt b's other samples,
never y_bi) and M_b and lam_b are computed from the *other prompts* only. The baseline is
then independent of y_bi, E[grad log pi(y_bi) | everything else] = 0, and the estimate
keeps the expectation of the unshrunk estimator for every batch and every rule for lam
that uses only the other prompts (checked by enumeration in
tests/objectives/test_shrinkage.py). NOT unbiased: M or lam computed from the whole batch,
prompt b included (the "plug-in" form, as in JSPO's "++" variant): y_bi then enters its
own baseline through M with weight lam / (B N) and through lam (the test measures a bias
of 0.039 on gradients of about 0.22 at B = 3, N = 3); likewise a mix with the group mean
that includes y_bi (Dr.GRPO's baseline). Even rounding can leak: lam is a ratio that can
be 0/0, so one batch-wide shift by a data value made lam_b depend on y_bi's rounding;
kjax shifts each row by its own member and sums over the other rows with masks instead.

The shrinkage factor. lam_b minimises E[(baseline - mu_b)^2], mu_b the value L_bi
estimates, when the prompts' values are spread with variance tau^2 and L_bi has noise
variance nu: lam = nu / (nu + E[(M_b - mu_b)^2]). From the other prompts b' != b:

    nu_b'  = sum_i (L_b'i - Lbar_b')^2          jackknife variance of one LOO value
    nu     = mean_{b' != b} nu_b'               pooled noise of a leave-one-out value
    M_b    = mean_{b' != b} Lbar_b'             the shrinkage target
    S^2    = var_{b' != b}(Lbar_b') (ddof 1)    spread of the other prompts' estimates
    tau^2  = max(S^2 - nu (N-1)/N, 0)           spread minus their own noise
    d^2    = tau^2 B/(B-1) + nu (N-1) / (N (B-1))    E[(M_b - mu_b)^2]
    lam_b  = nu / (nu + d^2)  in [0, 1]  (0 if both are 0)

Lbar_b' = mean_i L_b'i is the full-group estimate (a U-statistic is the mean of its
leave-one-out versions). For the mean objective L_bi = mean_{j != i} r_bj and nu_b' is the
unbiased within-prompt variance / (N - 1); for large B, lam is then the positive-part
James-Stein factor (within-prompt variance / N) / (between-prompt variance of the group
means) clipped to [0, 1], with leave-one-out corrections. B <= 2 leaves fewer than two
other prompts to measure a spread: lam = 0, the unshrunk estimator. (JSPO's code uses
v / (v + s^2) with the raw spread s^2, which never shrinks more than about halfway when
the prompts are alike; kjax subtracts the noise from the spread.)

Variance. For the mean this is the paper's setting and the shrunk baseline lowered the
exact variance in every case tried (ratios 0.48-0.89, 3 prompts). For max@k, L_bi is also
a control variate for how s_i depends on the other samples, which a constant target
lacks, so the MSE-optimal lam can overshoot: lower variance on binary rewards (exact
ratios 0.31-0.93), but up to about 20% higher on the continuous toy of
experiments/tables/estimator_variance.py (--extended), where the best lam was 0.25-0.5.

The batch couples the rows: a NaN reward anywhere makes every prompt's advantages NaN
once B >= 3, and an all-equal group gets lam_b (r - M_b) != 0 (an all-wrong prompt is
pushed down when the others sometimes succeed), so "some advantage != 0" no longer marks
the informative groups of dynamic sampling.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kjax.objectives import binomial
from kjax.objectives._validate import check_group, check_k
from kjax.objectives.advantages import (
    MaxAtKEstimator,
    max_at_k_advantages,
    prefix_sum_exclusive,
    sort_group,
    suffix_sum_exclusive,
)
from kjax.objectives.shrinkage_mean import shrinkage_factor

# Estimators whose baseline is c * m_j(all but i), with (j, c) as functions of (N, k):
# LOO: s_i - k/(N-1) m_k(others); L2O: s_i - (k/N) m_k(others); LOO_MINUS_ONE:
# (1/C(N,k)) sum_{I ∋ i} max_{I \ i} = (k/N) m_{k-1}(others) (k = 1: RLOO / N, j = 1).
SHRINKABLE = (MaxAtKEstimator.LOO, MaxAtKEstimator.L2O, MaxAtKEstimator.LOO_MINUS_ONE)


@functools.lru_cache(maxsize=256)
def _leave_one_out_weights(n: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    """(below, above) [N]: C(q-1,j-1)/C(N-1,j) and C(q-2,j-1)/C(N-1,j), ranks q = 1..N."""
    q = np.arange(1, n + 1)
    return binomial.comb_ratio(q - 1, j - 1, n - 1, j), binomial.comb_ratio(q - 2, j - 1, n - 1, j)


def leave_one_out_max_at_k(rewards: jax.Array, j: int) -> jax.Array:
    """[B, N]: m_j(all samples of the row but i), the unbiased max@j of the other N - 1.

    Removing sorted rank p leaves rank q < p at q and q > p at q - 1 (docs/estimators.md
    section 2.5): m_j = [sum_{q<p} C(q-1,j-1) r_(q) + sum_{q>p} C(q-2,j-1) r_(q)] / C(N-1,j).
    Needs 1 <= j <= N - 1 (validated by the callers).
    """
    n = rewards.shape[1]
    dtype = rewards.dtype
    r, _, inverse = sort_group(rewards)
    below, above = _leave_one_out_weights(n, j)
    out = prefix_sum_exclusive(jnp.asarray(below, dtype) * r) + suffix_sum_exclusive(
        jnp.asarray(above, dtype) * r
    )
    return jnp.take_along_axis(out, inverse, axis=-1)


def _baseline_form(estimator: MaxAtKEstimator, n: int, k: int) -> tuple[int, float]:
    """(j, c): the estimator's baseline is c * m_j(all but i)."""
    if estimator is MaxAtKEstimator.LOO:
        return k, k / (n - 1)
    if estimator is MaxAtKEstimator.L2O:
        return k, k / n
    return max(k - 1, 1), k / n  # LOO_MINUS_ONE


def shrink_max_at_k_advantages(
    rewards: jax.Array,
    k: int,
    estimator: MaxAtKEstimator = MaxAtKEstimator.LOO_MINUS_ONE,
) -> jax.Array:
    """max@k advantages whose leave-one-out baseline is shrunk toward the other prompts.

    LOO, L2O and LOO_MINUS_ONE all read A_i = s_i - c m_j(all but i) (L2O and LOO:
    j = k; LOO_MINUS_ONE: j = k - 1, or RLOO / N at k = 1). The shrunk estimator replaces
    m_j(all but i) by (1 - lam_b) m_j(all but i) + lam_b M_b, with M_b and lam_b from the
    other prompts (`shrinkage_factor`), i.e.

        A'_bi = A_bi + c lam_b (m_j(all but i) - M_b).

    Unbiased for grad max@k (the sum over prompts of each prompt's grad J_k), like the
    unshrunk estimator; B <= 2 returns the unshrunk advantages. It is no longer centred
    (L2O) or non-negative (LOO_MINUS_ONE): a whole group moves by c lam_b (its own
    estimate - M_b). Lower variance on binary rewards in the tests, but lam is the mean's
    MSE-optimal factor and can overshoot for max@k (module docstring: up to about 20%
    more variance on a continuous toy). docs/estimators.md section 2.11.

    Args:
      rewards: [B, N] float; N >= 2 and N >= estimator.min_samples(k).
      k: static int >= 1.
      estimator: LOO, L2O or LOO_MINUS_ONE (the estimators with a leave-one-out baseline).

    Returns:
      [B, N] advantages in the sum convention of `max_at_k_advantages`, under stop_gradient.
    """
    rewards = check_group(rewards, "rewards", "float")
    n = rewards.shape[1]
    if estimator not in SHRINKABLE:
        names = ", ".join(f"MaxAtKEstimator.{e.name}" for e in SHRINKABLE)
        raise ValueError(
            f"`estimator` must be one of {names} (a leave-one-out baseline to shrink); "
            f"got {estimator!r}."
        )
    k = check_k(k, n)
    check_k(k, n, min_n=max(estimator.min_samples(k), 2))
    adv = max_at_k_advantages(rewards, k, estimator)
    if rewards.shape[0] <= 2:
        return adv
    j, c = _baseline_form(estimator, n, k)
    first = rewards[:, :1]  # a per-row shift, as in `mean_shrinkage_advantages`
    loo = leave_one_out_max_at_k(rewards - first, j) + first
    lam, target = shrinkage_factor(loo)
    return jax.lax.stop_gradient(adv + (c * lam)[:, None] * (loo - target[:, None]))


def shrink_max_at_k_mixture_advantages(
    rewards: jax.Array,
    weights,
    estimator: MaxAtKEstimator = MaxAtKEstimator.LOO_MINUS_ONE,
) -> jax.Array:
    """sum_k w_k shrink_max_at_k_advantages(rewards, k, estimator): the mixture of
    `max_at_k_mixture_advantages` with each k's leave-one-out baseline shrunk on its own
    (its own lam and target per k). Unbiased for sum_k w_k grad J_k, as each term is.

    weights: {k: w_k} or ((k, w_k), ...), static ints k, finite w_k >= 0 (e.g.
    maxrl_weights(T)); a zero weight's term is skipped.
    """
    rewards = check_group(rewards, "rewards", "float")
    items = weights.items() if hasattr(weights, "items") else weights
    terms = [w * shrink_max_at_k_advantages(rewards, k, estimator) for k, w in items if w]
    if not terms:
        return jnp.zeros_like(rewards)
    return jax.lax.stop_gradient(sum(terms[1:], terms[0]))
