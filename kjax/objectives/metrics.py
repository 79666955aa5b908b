"""Unbiased k-sample metrics from N >= k samples per prompt: pass@k and max@k.

Both are U-statistics: the average, over all C(N, k) subsets of the N samples, of the
metric on that subset. maj@k lives in `majority.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kjax.objectives import binomial
from kjax.objectives._validate import check_group, check_k


def float_dtype():
    """The default float dtype: float32, or float64 when jax_enable_x64 is on."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def pass_at_k(correct: jax.Array, k: int) -> jax.Array:
    """Unbiased pass@k = 1 - C(N-c, k) / C(N, k) per prompt (Chen et al. 2021, Codex).

    Args:
      correct: [B, N] bool. Whether each sample is correct.
      k: static int, 1 <= k <= N. No unbiased estimate exists for N < k: this raises
        instead of returning a silent 1.0.

    Returns:
      [B] float: pass@k per prompt.

    Example:
      >>> pass_at_k(jnp.array([[True, False, False, False]]), k=2)  # 1 - C(3,2)/C(4,2)
      Array([0.5], dtype=float32)
    """
    correct = check_group(correct, "correct", "bool")
    n = correct.shape[1]
    k = check_k(k, n)
    table = jnp.asarray(binomial.pass_at_k_table(n, k), dtype=float_dtype())
    return table[jnp.sum(correct, axis=-1, dtype=jnp.int32)]


def max_at_k(rewards: jax.Array, k: int) -> jax.Array:
    """Unbiased max@k, the expected best reward of k samples (PKPO Thm 3; Bagirov et al. 2025).

    m_k = sum_{i=k..N} C(i-1, k-1) / C(N, k) * r_(i) over ascending-sorted rewards; the
    weights are exact float64 constants of (N, k). Equals pass@k on {0, 1} rewards.

    Args:
      rewards: [B, N] float.
      k: static int, 1 <= k <= N.

    Returns:
      [B] float: max@k per prompt, in the rewards' dtype.
    """
    rewards = check_group(rewards, "rewards", "float")
    n = rewards.shape[1]
    k = check_k(k, n)
    w = jnp.asarray(binomial.max_at_k_weights(n, k), dtype=rewards.dtype)
    return jnp.sort(rewards, axis=-1) @ w
