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
    (so an all-equal group is exactly 0, as the fast version promises)."""
    rewards = np.asarray(rewards, dtype=np.float64)
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
