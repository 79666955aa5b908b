"""Accuracy of best-of-n selection as a function of n, without the noise of one draw.

`best_of_n_accuracy` is exact: the U-statistic over all C(N, n) subsets of N samples, in
O(N log N) (the max@k idea: only the rank of the subset's top score matters).
`subset_accuracy` averages any selector over subsets (all of them when few, else many
uniformly random ones) for rules with no closed form, such as Borda voting.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kjax.objectives import binomial
from kjax.objectives._validate import check_group, check_k, check_same_shape


def best_of_n_accuracy(scores: jax.Array, correct: jax.Array, n: int) -> jax.Array:
    """Expected correctness of the top-scored sample of a uniformly random n-subset.

    Ties in score are split evenly among the tied samples of the subset. With L_i samples
    scored below sample i and G_i scored at most s_i, the subset's top score equals s_i
    with probability (C(G_i, n) - C(L_i, n)) / C(N, n), and by exchangeability each of
    the G_i - L_i samples tied at s_i is then the pick equally often:

      acc = sum_i correct_i (C(G_i, n) - C(L_i, n)) / (C(N, n) (G_i - L_i)).

    n = 1 gives the mean correctness; n = N the (tie-split) correctness of the argmax.
    Binomial ratios are exact float64 constants of (N, n).

    Args:
      scores: [B, N] float, the selector's score per sample (NaN ranks lowest).
      correct: [B, N] bool.
      n: static int, 1 <= n <= N (ValueError otherwise: no unbiased estimate exists).

    Returns:
      [B] float32.
    """
    scores = check_group(scores, "scores", "float")
    correct = check_group(correct, "correct", "bool")
    check_same_shape(scores, "scores", correct, "correct")
    N = scores.shape[1]
    n = check_k(n, N, name="n")
    s = jnp.where(jnp.isnan(scores), -jnp.inf, scores)
    srt = jnp.sort(s, axis=-1)
    below = jax.vmap(lambda a, v: jnp.searchsorted(a, v, side="left"))(srt, s)
    at_most = jax.vmap(lambda a, v: jnp.searchsorted(a, v, side="right"))(srt, s)
    table = jnp.asarray(binomial.comb_ratio(np.arange(N + 1), n, N, n), jnp.float32)
    weight = (table[at_most] - table[below]) / (at_most - below).astype(jnp.float32)
    return jnp.sum(jnp.where(correct, weight, 0.0), axis=-1)


def subsets(N: int, n: int, max_subsets: int, key: jax.Array) -> np.ndarray:
    """[S, n] int32 index subsets: all C(N, n) when <= max_subsets, else max_subsets
    uniformly random ones (each a random permutation's prefix, so its order is random)."""
    if math.comb(N, n) <= max_subsets:
        return np.array(list(itertools.combinations(range(N), n)), np.int32).reshape(-1, n)
    keys = jax.random.split(key, max_subsets)
    perms = jax.vmap(lambda k: jax.random.permutation(k, N))(keys)
    return np.asarray(perms[:, :n], np.int32)


def subset_accuracy(
    select: Callable[..., jax.Array],
    inputs: tuple[jax.Array, ...],
    correct: jax.Array,
    n: int,
    *,
    key: jax.Array,
    max_subsets: int = 256,
) -> jax.Array:
    """Mean over n-subsets of the correctness of `select`'s pick: [B] float32.

    Exact (every subset) when C(N, n) <= max_subsets; otherwise an unbiased Monte Carlo
    estimate over max_subsets random subsets shared by all B prompts.

    Args:
      select: (*[B, n] arrays) -> [B] int indices into the subset (a selector).
      inputs: [B, N] arrays passed to select, each restricted to the subset.
      correct: [B, N] bool.
      n: static int, 1 <= n <= N.
      key: PRNG key for the random subsets.
      max_subsets: S, the number of subsets averaged at most.
    """
    correct = check_group(correct, "correct", "bool")
    N = correct.shape[1]
    n = check_k(n, N, name="n")
    idx = jnp.asarray(subsets(N, n, max_subsets, key))  # [S, n]

    def one(sub):
        picked = select(*(jnp.asarray(x)[:, sub] for x in inputs))
        return jnp.take_along_axis(correct[:, sub], picked[:, None], axis=1)[:, 0]

    return jnp.mean(jax.lax.map(one, idx).astype(jnp.float32), axis=0)
