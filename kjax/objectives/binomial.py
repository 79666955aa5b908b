"""Static binomial-coefficient tables, computed once per (N, k) in float64 on the host.

N (the group size) and k are static under jit, so every combinatorial weight the
estimators need is a compile-time constant: exact in float64, then cast to the
rewards' dtype. No log-gamma differences of large numbers ever happen in float32.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=64)
def _log_factorials(m: int) -> np.ndarray:
    """log(0!), ..., log(m!) in float64."""
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, m + 1, dtype=np.float64)))])


def log_comb(a, b) -> np.ndarray:
    """log C(a, b) elementwise in float64; -inf where the coefficient is 0 (b < 0 or b > a)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    a, b = np.broadcast_arrays(a, b)
    valid = (b >= 0) & (b <= a) & (a >= 0)
    lf = _log_factorials(int(max(a.max(initial=0), 0)))
    aa, bb = np.where(valid, a, 0), np.where(valid, b, 0)
    out = lf[aa] - lf[bb] - lf[aa - bb]
    return np.where(valid, out, -np.inf)


def comb_ratio(a, b, n: int, k: int) -> np.ndarray:
    """C(a, b) / C(n, k) elementwise in float64 (0 where C(a, b) = 0)."""
    return np.exp(log_comb(a, b) - log_comb(n, k))


@functools.lru_cache(maxsize=256)
def max_at_k_weights(n: int, k: int) -> np.ndarray:
    """w[i-1] = C(i-1, k-1) / C(n, k) for sorted positions i = 1..n; sums to 1.

    max@k from ascending-sorted rewards is sum_i w_i r_(i) (PKPO Thm 3).
    """
    i = np.arange(1, n + 1)
    return comb_ratio(i - 1, k - 1, n, k)


@functools.lru_cache(maxsize=256)
def pass_at_k_table(n: int, k: int) -> np.ndarray:
    """t[c] = 1 - C(n-c, k) / C(n, k) for c = 0..n correct samples (Chen et al. 2021)."""
    c = np.arange(n + 1)
    return 1.0 - comb_ratio(n - c, k, n, k)
