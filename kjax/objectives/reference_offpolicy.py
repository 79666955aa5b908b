"""Slow float64 oracle for the off-policy max@k advantages: enumerate every k-subset.

Each line is the definition in docs/estimators.md section 4, with no sorting, no recursions
and no code shared with `kjax.objectives.offpolicy`. Inputs are numpy [B, N]; N <= 10.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def _other_weights(log_ratio: np.ndarray, k: int, l2o: bool, exact: bool, clamp):
    """Per-sample factors that enter the others' products: truncated rho, or delta."""
    rho = np.exp(log_ratio)
    if exact:
        if clamp is None:
            return rho
        return np.clip(rho, max(1.0 - clamp, 0.0), 1.0 + clamp)
    m = k if l2o else k - 1  # ratios per product: 1 + sum of m deltas must stay >= 0
    lo = 1.0 / m if m >= 1 else math.inf
    if clamp is not None:
        lo = min(lo, clamp)
    return np.clip(rho - 1.0, -lo, math.inf if clamp is None else clamp)


def _product(w: np.ndarray, members, exact: bool) -> float:
    """prod_{l in members} rho_l (exact), or its first-order form 1 + sum delta_l."""
    members = list(members)
    if exact:
        return float(np.prod(w[members]))
    return 1.0 + float(np.sum(w[members]))


def _group(r, w, k: int, name: str, exact: bool) -> np.ndarray:
    n = len(r)
    out = np.zeros(n)
    if name == "LOO_MINUS_ONE" and k == 1:
        if n == 1:
            return out
        name = "L2O"  # max of the empty set is undefined: k = 1 is the L2O (RLOO) form
    for i in range(n):
        others = [j for j in range(n) if j != i]
        total = 0.0
        for rest in itertools.combinations(others, k - 1):
            subset = list(rest) + [i]
            value = r[subset].max()
            if name == "LOO_MINUS_ONE":
                value -= r[list(rest)].max()
            total += _product(w, rest, exact) * value
        out[i] = total / math.comb(n, k)
        if name == "L2O":
            m_rest = sum(
                _product(w, sub, exact) * r[list(sub)].max()
                for sub in itertools.combinations(others, k)
            ) / math.comb(n - 1, k)
            out[i] -= (k / n) * m_rest
    return out


def max_at_k_offpolicy_advantages_ref(
    rewards, log_ratio, k: int, estimator, exact: bool = True, clamp: float | None = None
) -> np.ndarray:
    """[B, N]: A'_i = (1/C(N,k)) sum_{|I|=k, i in I} (prod_{I \\ i} rho) (max_I - b(I \\ i)).

    b = 0 (S), max(I \\ i) (LOO_MINUS_ONE); L2O is S minus (k/N) m~_k(all but i).
    estimator: a MaxAtKEstimator (only its name is read).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    log_ratio = np.asarray(log_ratio, dtype=np.float64)
    name = estimator.name
    l2o = name == "L2O" or (name == "LOO_MINUS_ONE" and k == 1)  # k = 1: the L2O form
    return np.stack(
        [
            _group(r, _other_weights(lr, k, l2o, exact, clamp), k, name, exact)
            for r, lr in zip(rewards, log_ratio, strict=True)
        ]
    )
