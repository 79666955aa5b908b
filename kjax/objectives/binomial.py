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


# Estimator tables on ascending-sorted rewards r_(1) <= ... <= r_(n), 1-based ranks.
# Every table is a function of (n, k) only, never of the rank p being scored, so a
# mixture over k is a sum of tables and one pass of prefix/suffix sums serves all k.


def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for a in arrays:
        a.setflags(write=False)  # cached: a caller must not edit them in place
    return arrays


@functools.lru_cache(maxsize=256)
def s_linear_weights(n: int, k: int) -> tuple[np.ndarray, ...]:
    """(own, below, above) [n] of PKPO's s on sorted ranks p = 1..n.

    The linear form of S and LOO: A_p = own_p r_(p) + sum_{j<p} below_j r_(j)
    + sum_{j>p} above_j r_(j). PKPO Thm 4:
    s_p = [C(p-1,k-1) r_(p) + sum_{j>p} C(j-2,k-2) r_(j)] / C(n,k).
    """
    j = np.arange(1, n + 1)
    return _frozen(max_at_k_weights(n, k).copy(), np.zeros(n), comb_ratio(j - 2, k - 2, n, k))


@functools.lru_cache(maxsize=256)
def loo_linear_weights(n: int, k: int) -> tuple[np.ndarray, ...]:
    """(own, below, above) [n] of PKPO's LOO: s_p - (k/(n-1)) m_k(all but rank p); n > k.

    Removing rank p leaves r_(j) at rank j for j < p and at rank j-1 for j > p of the
    n-1 others, whose max@k weights are w'_j = C(j-1,k-1)/C(n-1,k).
    """
    own, _, above = s_linear_weights(n, k)
    rest = (k / (n - 1)) * max_at_k_weights(n - 1, k)  # [n-1], by rank among the others
    below = -np.concatenate([rest, [0.0]])
    above = above - np.concatenate([[0.0], rest])
    return _frozen(own.copy(), below, above)


@functools.lru_cache(maxsize=256)
def loo_minus_one_gap_weights(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) [n-1] on the gaps d_g = r_(g+1) - r_(g), g = 1..n-1.

    A_p = sum_{g<p} lower_g d_g + sum_{g>=p} upper_g d_g (Abel summation of the linear form,
    exact because the coefficients of each A_p sum to 0). PKPO eq. 33 for k >= 2:
    A_p = sum_{j<p} C(j-1,k-2)(r_(p) - r_(j)) / C(n,k), so lower_g = C(g,k-1)/C(n,k) by the
    hockey-stick identity and upper = 0: every term is >= 0, nothing cancels. k = 1 is
    RLOO / n, (r_p - mean_{j != p} r_j) / n: lower_g = g/(n(n-1)), upper_g = -(n-g)/(n(n-1)).
    """
    g = np.arange(1, n, dtype=np.float64)
    if k == 1:
        return _frozen(g / (n * (n - 1)), -(n - g) / (n * (n - 1)))
    return _frozen(comb_ratio(g.astype(np.int64), k - 1, n, k), np.zeros(n - 1))


@functools.lru_cache(maxsize=256)
def l2o_gap_weights(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) [n-1] of L2O, A_p = m_k(all) - m_k(all but rank p), n > k.

    m_k(S) = min S + sum_g d_g P(the best of k draws from S exceeds r_(g)), and
    P = 1 - C(#S <= r_(g), k)/C(|S|, k). Without rank p, #S <= r_(g) is g for g < p and
    g - 1 for g >= p; with u_g = C(g,k)/C(n,k) and C(g-1,k)/C(g,k) = (g-k)/g this gives
    lower_g = (k/(n-k)) u_g >= 0 and upper_g = -(k/(n-k)) u_g (n-g)/g <= 0.
    """
    g = np.arange(1, n)
    u = comb_ratio(g, k, n, k) * (k / (n - k))
    return _frozen(u, -u * (n - g) / g)
