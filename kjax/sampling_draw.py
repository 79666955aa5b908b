"""The draw of kjax's samplers: the processed (temperature / top-k / top-p) distribution
of each row's logits and one token from it by inverse CDF, with its log-probabilities.

Split out of kjax.sampling (which re-exports these names); a leaf: jax only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NUCLEUS_CANDIDATES = 64  # top-p from a top-k of this size; exact fallback: bisection over V


def processed_logprobs(logits, temperature, top_k: int = 0, top_p: float = 1.0):
    """Log-probabilities [R,V] of the sampling distribution: logits/temperature, then top-k,
    then top-p (the order of transformers' warpers); -inf outside the support.

    logits: [R,V] float32. temperature: > 0 (scalar, may be traced).
    Ties at the top-k / top-p boundary are all kept, so the support is deterministic.
    """
    scaled = logits / temperature
    if top_k:
        kth = jnp.min(_top_values(scaled, top_k), axis=-1, keepdims=True)
        scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
    logp = jax.nn.log_softmax(scaled)
    if top_p < 1.0:
        logp = jax.nn.log_softmax(
            jnp.where(logp >= _nucleus_threshold(logp, top_p), logp, -jnp.inf)
        )
    return logp


def _top_values(x, k: int):
    """The k largest values [R,k] of each row of x [R,V], sorted descending. The barrier
    stops XLA:CPU from turning top_k-then-slice into a full sort (50x slower at V=49152)."""
    return jax.lax.optimization_barrier(jax.lax.top_k(x, k)[0])


def _nucleus_threshold(logp, top_p: float):
    """Per-row log-prob [R,1] of the least likely token of the top-p nucleus: the smallest
    set of most likely tokens whose mass reaches top_p (a token stays while the mass strictly
    above it is < top_p). From the top candidates when they hold top_p of the mass, else
    from an exact bisection over float32 bit patterns (no sort of V: ~1 s on a CPU)."""
    V = logp.shape[-1]
    vals = _top_values(logp, min(V, _NUCLEUS_CANDIDATES))
    p = jnp.exp(vals)
    keep = jnp.cumsum(p, axis=-1) - p < top_p
    threshold = jnp.min(jnp.where(keep, vals, jnp.inf), axis=-1, keepdims=True)
    if vals.shape[-1] == V:
        return threshold
    reached = jnp.all(jnp.sum(p, axis=-1) >= top_p)
    return jax.lax.cond(reached, lambda: threshold, lambda: _bisect_threshold(logp, top_p))


def _bisect_threshold(logp, top_p: float):
    """Same threshold by bisection: non-negative float32s order like their int32 bits, so
    31 halvings of [bits(0), bits(1)] find the exact boundary token, one pass over V each."""
    p = jnp.exp(logp)
    bits = jax.lax.bitcast_convert_type(p, jnp.int32)
    mass_above = lambda t: jnp.sum(jnp.where(bits > t[:, None], p, 0.0), axis=-1)

    def halve(_, bounds):  # invariant: mass_above(lo) >= top_p > mass_above(hi)
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        above = mass_above(mid) < top_p
        return jnp.where(above, lo, mid), jnp.where(above, mid, hi)

    R = logp.shape[0]
    one = jax.lax.bitcast_convert_type(jnp.float32(1.0), jnp.int32)
    bounds = (jnp.full((R,), -1, jnp.int32), jnp.full((R,), one, jnp.int32))
    _, hi = jax.lax.fori_loop(0, 31, halve, bounds)
    # Kept: bits >= hi. Return the smallest kept log-prob as the threshold.
    return jnp.min(jnp.where(bits >= hi[:, None], logp, jnp.inf), axis=-1, keepdims=True)


def draw(logp, u):
    """Inverse-CDF draw from each row of logp [R,V] with one uniform u [R] in [0,1).

    Two levels (blocks of tokens, then tokens within the chosen block) so the cost is one
    pass over V instead of V random numbers (Gumbel-max) or a length-V cumsum per row.
    Returns token ids [R] int32, never one of zero probability.
    """
    R, V = logp.shape
    block = min(V, 256)
    pad = -V % block
    p = jnp.pad(jnp.exp(logp), ((0, 0), (0, pad))).reshape(R, -1, block)
    mass = p.sum(-1)  # [R, V/block]
    target = u * mass.sum(-1)
    j = _first_above(jnp.cumsum(mass, -1), target, mass > 0)
    inner = jnp.take_along_axis(p, j[:, None, None], axis=1)[:, 0]  # [R, block]
    rest = target - jnp.take_along_axis(jnp.cumsum(mass, -1) - mass, j[:, None], 1)[:, 0]
    i = _first_above(jnp.cumsum(inner, -1), rest, inner > 0)
    return (j * block + i).astype(jnp.int32)


def _first_above(cdf, target, positive):
    """First index where cdf [R,C] > target [R] among positive entries; the last positive
    entry if rounding puts target past the end."""
    idx = jnp.arange(cdf.shape[-1])
    hit = (cdf > target[:, None]) & positive
    first = jnp.min(jnp.where(hit, idx, cdf.shape[-1]), axis=-1)
    last = jnp.max(jnp.where(positive, idx, -1), axis=-1)
    return jnp.where(first < cdf.shape[-1], first, last)


def _choose(logits, key, temperature, top_k: int, top_p: float, greedy: bool):
    """One token per row of logits [R,V]: (tokens, logprobs, model_logprobs), each [R].

    `greedy` is static so a sampling run never pays for an argmax over V, nor greedy for
    the processing."""
    u = None if greedy else jax.random.uniform(key, logits.shape[:1])
    return _choose_with(logits, u, temperature, top_k, top_p, greedy)


def _choose_with(logits, u, temperature, top_k: int, top_p: float, greedy: bool):
    """`_choose` with the uniforms u [R] given (None when greedy): the compacting decode
    hands each row the uniform its sample has in the full [B*N] vector."""
    pick = lambda a, token: jnp.take_along_axis(a, token[:, None], axis=-1)[:, 0]
    if greedy:
        # First index of the maximum, as argmax, in two plain reductions (2x faster on CPU).
        top = jnp.max(logits, axis=-1, keepdims=True)
        index = jnp.arange(logits.shape[-1], dtype=jnp.int32)
        token = jnp.min(jnp.where(logits == top, index, logits.shape[-1]), axis=-1)
        logprob = jnp.zeros(token.shape, jnp.float32)
    else:
        logp = processed_logprobs(logits, temperature, top_k, top_p)
        token = draw(logp, u)
        logprob = pick(logp, token)
    return token, logprob, pick(logits, token) - jax.nn.logsumexp(logits, axis=-1)
