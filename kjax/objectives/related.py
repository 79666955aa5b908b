"""Related objectives of the seed papers: BoN-aware weights (Chow et al. 2024).

The weight pass@N puts on a correct sample of a prompt whose single-sample failure
probability is p. Self-certainty and Borda voting (Kang et al. 2025) are inference-time
selection rules and live in kjax.inference; the confidence-limiting SFT loss of Chen et
al. 2025 (DCO) lives in kjax.rl.losses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bon_aware_weight(p_fail: jax.Array, n: int) -> jax.Array:
    """N p^(N-1) (1-p) / (1 - p^N): d log pass@N / d log q at q = 1 - p (Chow et al. 2024).

    The positive-sample weight of BoN-aware fine-tuning: near 1 for hard prompts (p -> 1,
    where every success counts) and near 0 for easy ones (p -> 0, already solved by N
    draws). Computed as N exp((N-1) log p) (1-p) / -expm1(N log p), stable in float32.

    Args:
      p_fail: [...] float in [0, 1], failure probability per prompt.
      n: static int >= 1, the N of best-of-N.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a static int >= 1; got {n!r}.")
    p = jnp.asarray(p_fail)
    if not jnp.issubdtype(p.dtype, jnp.floating):
        raise ValueError(f"`p_fail` must have a float dtype; got {p.dtype}.")
    if n == 1:
        return jnp.ones_like(p)
    log_p = jnp.log(jnp.clip(p, jnp.finfo(p.dtype).tiny, 1.0))
    # 1 - p^N via expm1: no cancellation near p = 1, where (1-p) is exact for the stored p.
    one_minus_pn = -jnp.expm1(n * log_p)
    safe = jnp.where(p >= 1.0, 1.0, one_minus_pn)
    w = n * jnp.exp((n - 1) * log_p) * (1.0 - p) / safe
    return jnp.where(p >= 1.0, 1.0, jnp.where(p <= 0.0, 0.0, w))  # the limits at 1 and 0
