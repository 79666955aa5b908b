"""Reward-free confidence of a response and confidence-weighted voting (Kang et al. 2025).

Self-certainty: the mean over a response's tokens of KL(Uniform_V || p); Borda voting:
answer classes collect (N - r + 1)^power votes from the response ranked r by it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kjax.objectives._validate import check_group, check_same_shape

_TIE_RTOL = 1e-5  # vote totals this close count as tied (float sums of equal weights)


def self_certainty(logits: jax.Array, mask: jax.Array, vocab_size: int | None = None):
    """Per-response confidence: mean over valid tokens of KL(Uniform_V || softmax(z)).

    KL(U || p) = logsumexp(z) - mean(z) - log V (Kang et al. 2025). Higher is more
    confident. Computed in float32 whatever the logits' dtype. `vocab_size` is the true
    vocabulary: logits beyond it (padding for sharding) are dropped, since they would
    change both the mean and log V.

    Args:
      logits: [B, N, T, V'] float, the model's logits at each completion position.
      mask: [B, N, T] bool, valid completion tokens.
      vocab_size: V <= V' (default V').

    Returns:
      [B, N] float32; 0 for a response with no valid tokens.
    """
    logits = jnp.asarray(logits)
    if logits.ndim != 4:
        raise ValueError(f"`logits` must be [B, N, T, V]; got shape {tuple(logits.shape)}.")
    mask = jnp.asarray(mask)
    check_same_shape(mask, "mask", logits[..., 0], "logits[..., 0] ([B, N, T])")
    v = logits.shape[-1] if vocab_size is None else vocab_size
    if not 1 <= v <= logits.shape[-1]:
        raise ValueError(f"`vocab_size` must be in [1, {logits.shape[-1]}]; got {v}.")
    z = logits[..., :v].astype(jnp.float32)
    per_token = jax.nn.logsumexp(z, axis=-1) - jnp.mean(z, axis=-1) - math.log(v)
    count = jnp.sum(mask, axis=-1)
    total = jnp.sum(jnp.where(mask, per_token, 0.0), axis=-1)
    return total / jnp.maximum(count, 1)


def certainty_rank(certainty: jax.Array) -> jax.Array:
    """[B, N] int32 ranks, 1 = most certain; equal certainties ranked by position."""
    order = jnp.argsort(-certainty, axis=-1, stable=True)
    return (jnp.argsort(order, axis=-1) + 1).astype(jnp.int32)


def class_votes(answers: jax.Array, weight: jax.Array) -> jax.Array:
    """Per sample, the total weight of the samples sharing its answer: [B, N] float32.

    Abstentions (answer < 0) give no weight and get -1, below any real class.
    """
    weight = jnp.where(answers >= 0, weight.astype(jnp.float32), 0.0)
    same = answers[:, :, None] == answers[:, None, :]  # [B, N, N]
    votes = jnp.einsum("bij,bj->bi", same.astype(jnp.float32), weight)
    return jnp.where(answers >= 0, votes, -1.0)


def borda_choice(certainty: jax.Array, answers: jax.Array, power: float = 1.0) -> jax.Array:
    """Index [B] int32 of the most certain response of the Borda winner (see borda_vote)."""
    certainty = check_group(certainty, "certainty", "float")
    answers = check_group(answers, "answers", "int")
    check_same_shape(certainty, "certainty", answers, "answers")
    if not power >= 0:
        raise ValueError(f"`power` must be >= 0; got {power}.")
    n = certainty.shape[1]
    rank = certainty_rank(certainty)
    votes = class_votes(answers, (n - rank + 1).astype(jnp.float32) ** power)
    best = jnp.max(votes, axis=-1, keepdims=True)
    tied = (votes >= best - _TIE_RTOL * jnp.abs(best)) & (answers >= 0)
    # Among tied classes, the one holding the most certain response wins; never the
    # smaller id, since verifiers number the reference answer's class 0 (a leak).
    # All abstain: the most certain response (every choice has the same answer).
    rank_if_tied = jnp.where(tied | (best < 0), rank, n + 1)
    return jnp.argmin(rank_if_tied, axis=-1).astype(jnp.int32)


def borda_vote(certainty: jax.Array, answers: jax.Array, power: float = 1.0) -> jax.Array:
    """Best-of-N answer by Borda voting on self-certainty ranks (Kang et al. 2025).

    The response ranked r (1 = most certain; equal certainties by position) gives its
    answer class (N - r + 1)^power votes; abstentions (answer -1) give none. Returns the
    class with most votes; on a tie, the tied class holding the most certain response
    (ids carry no order: class 0 is the reference's in kjax verdicts); -1 when every
    response abstains.

    Args:
      certainty: [B, N] float.
      answers: [B, N] int, answer-class ids (-1 = no answer).
      power: p >= 0; 0 is plain majority voting, large p approaches picking the most
        certain response.

    Returns:
      [B] int32 chosen answer ids.
    """
    chosen = borda_choice(certainty, answers, power)
    answers = jnp.asarray(answers)
    return jnp.take_along_axis(answers, chosen[:, None], axis=1)[:, 0].astype(jnp.int32)
