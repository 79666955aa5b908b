"""Slow, obviously correct float64 oracles: explicit enumeration of all k-subsets.

Every estimator in kjax.objectives is tested against the function of the same name
here (suffix `_ref`). Nothing here is clever: each definition is a line of the math in
docs/estimators.md. Inputs are numpy arrays [B, N]; use small N (<= 10).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

from kjax.objectives.advantages import MaxAtKEstimator, MeanBaseline
from kjax.objectives.reference_majority import (  # noqa: F401  (re-exported)
    majority_at_k_advantages_ref,
    majority_at_k_ref,
)


def _subsets(indices, k):
    return list(itertools.combinations(indices, k))


def pass_at_k_ref(correct, k: int) -> np.ndarray:
    """[B]: the fraction of k-subsets with at least one correct sample."""
    correct = np.asarray(correct, dtype=bool)
    n = correct.shape[1]
    return np.array(
        [np.mean([row[list(s)].any() for s in _subsets(range(n), k)]) for row in correct]
    )


def max_at_k_ref(rewards, k: int) -> np.ndarray:
    """[B]: the mean over k-subsets of the subset's best reward."""
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    return np.array(
        [np.mean([row[list(s)].max() for s in _subsets(range(n), k)]) for row in rewards]
    )


def mean_advantages_ref(rewards, baseline: MeanBaseline) -> np.ndarray:
    """[B, N]: RLOO, Dr.GRPO and GRPO from their definitions, in exact rational arithmetic
    (so an all-equal group is exactly 0, as the fast version promises); SHRINKAGE as
    r_i minus `shrink_loo_baseline_ref` of the means of the others."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if baseline is MeanBaseline.SHRINKAGE:
        loo = np.array([[np.mean(np.delete(row, i)) for i in range(len(row))] for row in rewards])
        return rewards - shrink_loo_baseline_ref(loo)
    out = np.zeros_like(rewards)
    for b, row in enumerate(rewards):
        exact = [Fraction(float(v)) for v in row]
        mean = sum(exact) / len(exact)
        std = math.sqrt(sum((v - mean) ** 2 for v in exact) / len(exact))
        for i, v in enumerate(exact):
            if baseline is MeanBaseline.RLOO:
                others = exact[:i] + exact[i + 1 :]
                out[b, i] = v - sum(others) / len(others)
            elif baseline is MeanBaseline.GROUP_MEAN:
                out[b, i] = v - mean
            else:
                out[b, i] = float(v - mean) / (std + 1e-6)
    return out


def _mean_max(row: np.ndarray, indices, k: int) -> float:
    """m_k of the samples `indices`: the mean over their k-subsets of the subset's best."""
    return float(np.mean([row[list(s)].max() for s in _subsets(indices, k)]))


def _s(row: np.ndarray, k: int) -> np.ndarray:
    """PKPO's s_i = (1/C(n,k)) sum over k-subsets I containing i of max_I."""
    n = len(row)
    subsets = _subsets(range(n), k)
    return np.array([sum(row[list(s)].max() for s in subsets if i in s) for i in range(n)]) / len(
        subsets
    )


def _group_max_advantages(row: np.ndarray, k: int, estimator: MaxAtKEstimator) -> np.ndarray:
    n = len(row)
    idx = range(n)
    others = [[j for j in idx if j != i] for i in idx]
    out = np.zeros(n)
    if estimator is MaxAtKEstimator.CHEN_ANALYTIC:
        big_r = _mean_max(row, idx, k)
        sigma = math.sqrt(big_r * (1 - big_r))
        if sigma == 0:
            return out
        for i in idx:
            if row[i] == 1:
                out[i] = (1 - big_r) / sigma
            else:  # chance that k-1 of the other samples are all wrong
                miss = np.mean([not row[list(s)].any() for s in _subsets(others[i], k - 1)])
                out[i] = (1 - big_r - miss) / sigma
        return out
    if estimator is MaxAtKEstimator.S:
        return _s(row, k)
    if estimator is MaxAtKEstimator.LOO:
        # PKPO's leave-one-out baseline: the mean, over the other samples j, of s_j computed
        # on the group without i. (This is where the k/(n-1) of eq. 29 comes from.)
        return np.array([_s(row, k)[i] - np.mean(_s(row[others[i]], k)) for i in idx])
    if estimator is MaxAtKEstimator.L2O:
        return np.array([_mean_max(row, idx, k) - _mean_max(row, others[i], k) for i in idx])
    # LOO_MINUS_ONE and CENTERED: (1/C(n,k)) sum over I containing i of max_I - max_{I - i}.
    # At k = 1, I - i is empty and has no max; the leave-one-out convention replaces it by
    # the expected best of the same number of draws from the others, here one draw: the
    # mean of the other samples (RLOO's baseline). A lone sample (n = 1) has none: 0.
    if k == 1 and n == 1:
        return out
    for i in idx:
        with_i = [s for s in _subsets(idx, k) if i in s]
        for s in with_i:
            rest = [j for j in s if j != i]
            base = row[rest].max() if rest else _mean_max(row, others[i], 1)
            out[i] += (row[list(s)].max() - base) / math.comb(n, k)
    if estimator is MaxAtKEstimator.CENTERED:
        out = out - out.mean()
    return out


def max_at_k_advantages_ref(rewards, k: int, estimator: MaxAtKEstimator) -> np.ndarray:
    """[B, N]: the estimators of docs/estimators.md section 2, by subset enumeration."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return np.stack([_group_max_advantages(row, k, estimator) for row in rewards])


def max_at_k_mixture_advantages_ref(
    rewards, weights: dict[int, float], estimator: MaxAtKEstimator
) -> np.ndarray:
    """[B, N]: sum_k w_k A^(k), one enumeration per k (the definition of the mixture)."""
    return sum(w * max_at_k_advantages_ref(rewards, k, estimator) for k, w in weights.items())


def _sum_sq_dev(row) -> float:
    """sum_i (x_i - mean x)^2 in exact rationals (exactly 0 for a constant row)."""
    exact = [Fraction(float(v)) for v in row]
    mean = sum(exact) / len(exact)
    return float(sum((v - mean) ** 2 for v in exact))


def shrink_loo_baseline_ref(loo) -> np.ndarray:
    """[B, N]: (1 - lam_b) L_bi + lam_b M_b, lam_b and M_b from the rows b' != b only
    (docs/estimators.md section 2.11), one prompt at a time from the definitions."""
    loo = np.asarray(loo, dtype=np.float64)
    num, n = loo.shape
    if num <= 2:  # fewer than two other prompts: no spread to measure, lam = 0
        return loo.copy()
    out = np.zeros_like(loo)
    for b in range(num):
        rest = np.delete(loo, b, axis=0)  # [B-1, N], the other prompts
        est = rest.mean(axis=1)  # each other prompt's full-group estimate
        nu = np.mean([_sum_sq_dev(row) for row in rest])  # pooled jackknife noise
        target = est.mean()
        tau2 = max(np.var(est, ddof=1) - nu * (n - 1) / n, 0.0)
        d2 = tau2 * num / (num - 1) + nu * (n - 1) / (n * (num - 1))
        lam = nu / (nu + d2) if nu + d2 > 0 else 0.0
        out[b] = (1 - lam) * loo[b] + lam * target
    return out


def shrink_max_at_k_advantages_ref(rewards, k: int, estimator: MaxAtKEstimator) -> np.ndarray:
    """[B, N]: s_i - c * shrunk m_j(all but i), every m_j by subset enumeration; (j, c) is
    (k, k/(N-1)) for LOO, (k, k/N) for L2O, (max(k-1, 1), k/N) for LOO_MINUS_ONE."""
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    j, c = {
        MaxAtKEstimator.LOO: (k, k / (n - 1)),
        MaxAtKEstimator.L2O: (k, k / n),
        MaxAtKEstimator.LOO_MINUS_ONE: (max(k - 1, 1), k / n),
    }[estimator]
    others = [[m for m in range(n) if m != i] for i in range(n)]
    loo = np.array([[_mean_max(row, others[i], j) for i in range(n)] for row in rewards])
    return np.stack([_s(row, k) for row in rewards]) - c * shrink_loo_baseline_ref(loo)


def maxrl_practical_advantages_ref(rewards) -> np.ndarray:
    """[B, N]: (r_i - mean r) / mean r, 0 for a group whose mean is 0."""
    rewards = np.asarray(rewards, dtype=np.float64)
    mean = rewards.mean(axis=1, keepdims=True)
    return np.where(mean == 0, 0.0, (rewards - mean) / np.where(mean == 0, 1.0, mean))
