"""Best-of-N selectors: pick one of N candidates per prompt, [B, N] -> chosen indices [B].

Every selector is deterministic and never looks at answer-id values for tie-breaking
(kjax verifiers number the reference answer's class 0, so "smaller id wins" would leak
the label). Ties go to the lowest index, except where a confidence order is at hand.
Samples are i.i.d., so a positional tie-break is a uniformly random one in distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from kjax.inference import confidence
from kjax.objectives._validate import check_group

C = TypeVar("C")


def select_by_score(scores: jax.Array) -> jax.Array:
    """The highest-scored candidate (a verifier's or reward model's score).

    Args:
      scores: [B, N] float. NaN ranks below every number (a failed scorer never wins).

    Returns:
      [B] int32; ties go to the lowest index.
    """
    scores = check_group(scores, "scores", "float")
    return jnp.argmax(jnp.where(jnp.isnan(scores), -jnp.inf, scores), axis=-1).astype(jnp.int32)


def select_by_reward(
    candidates: Sequence[Sequence[C]], reward_fn: Callable[[C], float]
) -> np.ndarray:
    """The candidate a scalar reward function scores highest (host-side, any objects).

    Args:
      candidates: [B][N] objects (e.g. completion strings); every row has N of them.
      reward_fn: candidate -> float (e.g. a reward model, a length penalty).

    Returns:
      [B] int32; ties go to the lowest index.
    """
    widths = {len(row) for row in candidates}
    if len(widths) != 1 or 0 in widths:
        raise ValueError(
            f"`candidates` must be [B][N] with the same N >= 1 per row; got row lengths "
            f"{sorted(widths)}."
        )
    scores = np.array([[float(reward_fn(c)) for c in row] for row in candidates], np.float32)
    return np.asarray(select_by_score(scores))


def select_by_self_certainty(logits, mask, vocab_size: int | None = None) -> jax.Array:
    """The most self-certain response (Kang et al. 2025; see confidence.self_certainty).

    Args:
      logits: [B, N, T, V'] float (cast to float32); columns >= vocab_size are padding.
      mask: [B, N, T] bool, valid completion tokens.
      vocab_size: the true vocabulary V <= V'.

    Returns:
      [B] int32; ties go to the lowest index.
    """
    return select_by_score(confidence.self_certainty(logits, mask, vocab_size))


def select_by_majority(answers: jax.Array) -> jax.Array:
    """A response of the most frequent answer class (majority vote / self-consistency).

    Abstentions (answer < 0) do not vote. Among classes tied for the most votes, the one
    that appears first wins, and the returned index is that class's first response.
    When every response abstains, returns 0 (all candidates have the same, empty answer).

    Args:
      answers: [B, N] int answer-class ids, -1 = no answer.

    Returns:
      [B] int32.
    """
    answers = check_group(answers, "answers", "int")
    votes = confidence.class_votes(answers, jnp.ones(answers.shape, jnp.float32))
    best = jnp.max(votes, axis=-1, keepdims=True)
    return jnp.argmax(votes == best, axis=-1).astype(jnp.int32)  # first maximum


def majority_vote(answers: jax.Array) -> jax.Array:
    """The majority answer id [B] int32 (select_by_majority's class), -1 if all abstain."""
    chosen = select_by_majority(answers)
    return jnp.take_along_axis(jnp.asarray(answers), chosen[:, None], axis=1)[:, 0]


def select_by_borda(certainty: jax.Array, answers: jax.Array, power: float = 1.0) -> jax.Array:
    """The most certain response of the class winning Borda voting on self-certainty ranks.

    Rank r (1 = most certain) gives its class (N - r + 1)^power votes (Kang et al. 2025);
    abstentions give none. Ties between classes go to the class holding the most certain
    response; when all abstain, the most certain response.

    Args:
      certainty: [B, N] float (e.g. self_certainty's output).
      answers: [B, N] int answer-class ids, -1 = no answer.
      power: p >= 0 (0: majority vote; large: most certain response).

    Returns:
      [B] int32.
    """
    return confidence.borda_choice(certainty, answers, power)


def chosen_correct(chosen: jax.Array, correct: jax.Array) -> jax.Array:
    """correct[b, chosen[b]]: [B] bool, whether each selector pick is correct.

    Args:
      chosen: [B] int indices into N. correct: [B, N] bool.
    """
    correct = check_group(correct, "correct", "bool")
    return jnp.take_along_axis(correct, jnp.asarray(chosen)[:, None].astype(jnp.int32), 1)[:, 0]
