"""The shrinkage baseline of the mean objective (MeanBaseline.SHRINKAGE), on its own.

`mean_advantages` (kjax.objectives.advantages) calls `mean_shrinkage_advantages`, and
kjax.objectives.shrinkage, which shrinks the max@k baselines, builds on advantages; keeping
the shrinkage factor here, importing nothing else of kjax, lets both depend on it without
an import circle. The math is in kjax.objectives.shrinkage's docstring (James-Stein
shrinkage of each prompt's leave-one-out baseline toward the other prompts' mean; Zeng,
Zhou, Arora & Zanette 2025), which takes shrinkage_factor from here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def shrinkage_factor(loo: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(lam [B], target M [B]) from the leave-one-out statistics L [B, N] of every prompt.

    Row b of both is an exact function of the other rows: sums over b' != b are masked,
    so row b's values cannot enter even through rounding (lam is a ratio that can be
    0/0; rounding that depended on y_bi would leak it into its own baseline). Formulas:
    kjax.objectives.shrinkage's docstring. B <= 2 gives lam = 0 and M = 0. Arguments are
    validated by the callers.
    """
    num, n = loo.shape
    if num <= 2:
        zero = jnp.zeros((num,), loo.dtype)
        return zero, zero
    # Deviations from a member of the row: exactly 0 for a constant row, so its noise is
    # exactly 0 and not rounding error.
    rel = loo - loo[:, :1]
    rel_mean = jnp.mean(rel, axis=-1)
    est = loo[:, 0] + rel_mean  # [B] each row's full-group estimate, mean_i L_bi
    nu_row = jnp.sum(jnp.square(rel - rel_mean[:, None]), axis=-1)  # [B] jackknife noise
    others = ~jnp.eye(num, dtype=bool)  # [b, b']: b' != b

    def over_others(x):  # [B, B] (b, b') -> [B]: the sum over b' != b, b' = b masked exactly
        return jnp.sum(jnp.where(others, x, 0.0), axis=-1)

    k = num - 1  # other prompts
    nu = over_others(jnp.broadcast_to(nu_row, (num, num))) / k
    target = over_others(jnp.broadcast_to(est, (num, num))) / k
    s2 = over_others(jnp.square(est[None, :] - target[:, None])) / (k - 1)
    tau2 = jnp.maximum(s2 - nu * ((n - 1) / n), 0.0)
    d2 = tau2 * (num / k) + nu * ((n - 1) / (n * k))
    total = nu + d2
    lam = jnp.where(total > 0, nu / jnp.where(total > 0, total, 1.0), 0.0)
    return lam, target


def mean_shrinkage_advantages(rewards: jax.Array) -> jax.Array:
    """MeanBaseline.SHRINKAGE: r_bi - [(1 - lam_b) mean_{j != i} r_bj + lam_b M_b].

    The mean convention of `mean_advantages`; unbiased for grad E[r] (N >= 2). Called by
    `mean_advantages`; arguments are validated there.
    """
    n = rewards.shape[1]
    # Each row is shifted by its own member (as in `mean_advantages`) and the shift added
    # back to the leave-one-out means: an all-equal row then has exactly constant ones.
    # Never one shift for the batch: rounding would then depend on that one reward and
    # leak it into every prompt's lam.
    shifted = rewards - rewards[:, :1]
    rloo = (shifted - jnp.mean(shifted, axis=-1, keepdims=True)) * (n / (n - 1))
    loo = (jnp.sum(shifted, axis=-1, keepdims=True) - shifted) / (n - 1) + rewards[:, :1]
    lam, target = shrinkage_factor(loo)
    return rloo + lam[:, None] * (loo - target[:, None])
