"""First-order (linearised) off-policy max@k weights on sorted rewards, O(N) per group.

Each product of the OTHERS' ratios in docs/estimators.md section 4 is replaced by
prod_{l in K} (1 + delta_l) ~ 1 + sum_{l in K} delta_l, so a sum over subsets K of size m
drawn from a set of size M with total delta D is C(M, m) + C(M-1, m-1) D (each element
lies in C(M-1, m-1) of them). Ranks are 0-based after an ascending sort and
D_t = sum_{l<t} delta_l. Classifying each subset by its top-ranked member j:

  S:     C(N,k) A'_t = r_t [C(t,k-1) + C(t-1,k-2) D_t]
                     + sum_{j>t} r_j [C(j-1,k-2)(1+d_j) + C(j-2,k-3)(D_j - d_t)]
  LOO-1: C(N,k) A'_t = sum_{j<t} u_j (r_t - r_j),  u_j = C(j,k-2)(1+d_j) + C(j-1,k-3) D_j
  L2O:   S minus (k/N) H_t / C(N-1,k), with
         H_t = sum_{j<t} r_j [C(j,k-1)(1+d_j) + C(j-1,k-2) D_j]
             + sum_{j>t} r_j [C(j-1,k-1)(1+d_j) + C(j-2,k-2)(D_j - d_t)].

This is Bagirov et al.'s w'_ij without the sample's own delta_i (the PPO ratio carries it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from kjax.objectives import binomial
from kjax.objectives.advantages import prefix_sum_exclusive, suffix_sum_exclusive


def linear_delta(log_ratio: jax.Array, k: int, name: str, clamp: float | None) -> jax.Array:
    """delta = rho - 1 clipped to [-min(c, 1/m), c]: a weight 1 + (sum of m deltas) >= 0.

    m is the number of ratios in a product: k-1 (S, LOO_MINUS_ONE) or k (L2O's baseline).
    """
    m = k if name == "L2O" else k - 1
    lo = 1.0 / m if m >= 1 else math.inf
    if clamp is not None:
        lo = min(lo, clamp)
    hi = math.inf if clamp is None else clamp
    return jnp.clip(jnp.expm1(log_ratio), -lo, hi)


def _w(a, b, n: int, k: int, dtype) -> jax.Array:
    """C(a, b) / C(n, k) as a constant of the given dtype."""
    return jnp.asarray(binomial.comb_ratio(a, b, n, k), dtype)


def linear_sorted(r: jax.Array, d: jax.Array, k: int, name: str) -> jax.Array:
    """A' at each sorted rank: r, d [B, N] sorted by reward. Formulas in the module docstring."""
    n = r.shape[1]
    t = np.arange(n)
    dt = r.dtype
    big_d = prefix_sum_exclusive(d)
    if name == "LOO_MINUS_ONE":  # k >= 2 here
        u = _w(t, k - 2, n, k, dt) * (1.0 + d) + _w(t - 1, k - 3, n, k, dt) * big_d
        shifted = r - r[..., -1:]  # r_t - r_j is shift-invariant; keeps float32 terms small
        adv = shifted * prefix_sum_exclusive(u) - prefix_sum_exclusive(u * shifted)
        return jnp.maximum(adv, 0.0)  # each u_j >= 0, so only rounding can go below 0

    alpha, beta, gamma = (_w(t - i, k - 1 - i, n, k, dt) for i in range(3))
    own = (alpha + beta * big_d) * r
    above = suffix_sum_exclusive((beta * (1.0 + d) + gamma * big_d) * r)
    adv = own + above - d * suffix_sum_exclusive(gamma * r)
    if name == "S":
        return adv

    # L2O baseline: (k/N) / C(N-1, k) = k / ((N-k) C(N, k)) as one factor on C(., .) / C(N, k).
    f = k / (n - k)
    below_w = _w(t, k - 1, n, k, dt) * (1.0 + d) + _w(t - 1, k - 2, n, k, dt) * big_d
    above_w = _w(t - 1, k - 1, n, k, dt) * (1.0 + d) + _w(t - 2, k - 2, n, k, dt) * big_d
    base = prefix_sum_exclusive(below_w * r) + suffix_sum_exclusive(above_w * r)
    base = base - d * suffix_sum_exclusive(_w(t - 2, k - 2, n, k, dt) * r)
    return adv - f * base
