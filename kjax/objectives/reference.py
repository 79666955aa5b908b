"""Slow, obviously correct float64 oracles: explicit enumeration of all k-subsets.

Every estimator in kjax.objectives is tested against the function of the same name
here (suffix `_ref`). Nothing here is clever: each definition is a line of the math in
shared/design/ESTIMATORS.md. Inputs are numpy arrays [B, N]; use small N (<= 10).
"""

from __future__ import annotations

import itertools
import math

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
    rewards = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(rewards)
    for b, row in enumerate(rewards):
        for i in range(len(row)):
            others = np.delete(row, i)
            if baseline is MeanBaseline.RLOO:
                out[b, i] = row[i] - others.mean()
            elif baseline is MeanBaseline.GROUP_MEAN:
                out[b, i] = row[i] - row.mean()
            else:
                out[b, i] = (row[i] - row.mean()) / (row.std() + 1e-6)
    return out


def _group_max_advantages(row: np.ndarray, k: int, estimator: MaxAtKEstimator) -> np.ndarray:
    n = len(row)
    total = math.comb(n, k)
    idx = range(n)
    out = np.zeros(n)
    if estimator is MaxAtKEstimator.CHEN_ANALYTIC:
        big_r = np.mean([row[list(s)].max() for s in _subsets(idx, k)])
        sigma = math.sqrt(big_r * (1 - big_r))
        if sigma == 0:
            return out
        for i in idx:
            if row[i] == 1:
                out[i] = (1 - big_r) / sigma
            else:  # chance that k-1 of the other samples are all wrong
                others = [j for j in idx if j != i]
                miss = np.mean([not row[list(s)].any() for s in _subsets(others, k - 1)])
                out[i] = (1 - big_r - miss) / sigma
        return out
    if k == 1 and estimator in (MaxAtKEstimator.LOO_MINUS_ONE, MaxAtKEstimator.CENTERED):
        # max over the empty set is undefined: k = 1 is RLOO in the sum convention.
        if n == 1:
            return out
        return np.array([(row[i] - np.delete(row, i).mean()) / n for i in idx])
    for i in idx:
        with_i = [s for s in _subsets(idx, k) if i in s]
        s_i = sum(row[list(s)].max() for s in with_i) / total
        if estimator is MaxAtKEstimator.S:
            out[i] = s_i
        elif estimator is MaxAtKEstimator.LOO:
            others = [j for j in idx if j != i]
            m_rest = np.mean([row[list(s)].max() for s in _subsets(others, k)])
            out[i] = s_i - k / (n - 1) * m_rest
        else:  # LOO_MINUS_ONE and CENTERED
            out[i] = (
                sum(row[list(s)].max() - row[[j for j in s if j != i]].max() for s in with_i)
                / total
            )
    if estimator is MaxAtKEstimator.CENTERED:
        out = out - out.mean()
    return out


def max_at_k_advantages_ref(rewards, k: int, estimator: MaxAtKEstimator) -> np.ndarray:
    """[B, N]: the estimators of ESTIMATORS.md section 2, by subset enumeration."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return np.stack([_group_max_advantages(row, k, estimator) for row in rewards])


def max_at_k_offpolicy_advantages_ref(rewards, log_ratio, k: int, clamp: float) -> np.ndarray:
    """[B, N]: A_i = (1/C(n,k)) sum_{I ni i} max_I r * (1 + sum_{l in I} delta_l)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    delta = np.clip(np.expm1(np.asarray(log_ratio, dtype=np.float64)), -clamp, clamp)
    n = rewards.shape[1]
    out = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        for s in _subsets(range(n), k):
            value = rewards[b, list(s)].max() * (1.0 + delta[b, list(s)].sum())
            for i in s:
                out[b, i] += value
    return out / math.comb(n, k)
