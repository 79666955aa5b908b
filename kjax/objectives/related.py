"""Related objectives of the seed papers: BoN-aware weights and self-certainty selection.

- Chow et al. 2024 (inference-aware fine-tuning for best-of-N): the weight pass@N puts
  on a correct sample of a prompt whose single-sample failure probability is p.
- Kang et al. 2025 (self-certainty): reward-free best-of-N by the model's own
  confidence, with Borda voting over answer classes.
The confidence-limiting SFT loss of Chen et al. 2025 (DCO) lives in kjax.rl.losses.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kjax.objectives._validate import check_group, check_same_shape


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


def self_certainty(logits: jax.Array, mask: jax.Array, vocab_size: int | None = None):
    """Per-response confidence: mean over valid tokens of KL(Uniform_V || softmax(z)).

    KL(U || p) = logsumexp(z) - mean(z) - log V (Kang et al. 2025). Higher is more
    confident. `vocab_size` is the true vocabulary: logits beyond it (padding for
    sharding) are dropped, since they would change both the mean and log V.

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


def borda_vote(certainty: jax.Array, answers: jax.Array, power: float = 1.0) -> jax.Array:
    """Best-of-N answer by Borda voting on self-certainty ranks (Kang et al. 2025).

    The response ranked r (1 = most certain) gives its answer class (N - r + 1)^power
    votes; abstentions (answer -1) give none. Returns the class with most votes, the
    smaller id on a tie, and -1 when every response abstains.

    Args:
      certainty: [B, N] float.
      answers: [B, N] int, answer-class ids (-1 = no answer).
      power: p >= 0; 0 is plain majority voting, large p approaches picking the most
        certain response.

    Returns:
      [B] int32 chosen answer ids.
    """
    certainty = check_group(certainty, "certainty", "float")
    answers = check_group(answers, "answers", "int")
    check_same_shape(certainty, "certainty", answers, "answers")
    if not power >= 0:
        raise ValueError(f"`power` must be >= 0; got {power}.")
    n = certainty.shape[1]
    # rank 1 = most certain; ties in certainty broken by position (stable sort).
    order = jnp.argsort(-certainty, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1) + 1
    weight = jnp.where(answers >= 0, (n - rank + 1).astype(jnp.float32) ** power, 0.0)
    # Votes per class, scored per sample: total weight of samples with the same answer.
    same = answers[:, :, None] == answers[:, None, :]  # [B, N, N]
    votes = jnp.einsum("bij,bj->bi", same.astype(jnp.float32), weight)
    votes = jnp.where(answers >= 0, votes, -1.0)
    best = jnp.max(votes, axis=-1, keepdims=True)
    big = jnp.iinfo(jnp.int32).max
    winner = jnp.min(jnp.where(votes == best, answers, big), axis=-1)
    return jnp.where(best[:, 0] < 0, -1, winner).astype(jnp.int32)
