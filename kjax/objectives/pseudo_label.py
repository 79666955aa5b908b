"""Label-free rewards from the group's own vote: test-time RL (TTRL, Zuo et al. 2025).

TTRL trains without reference answers: the N samples of a prompt vote, and each sample's
reward is whether its answer agrees with the vote's winner. Any k-sample objective can then
run on these rewards in place of the verifier's (kjax.rl: ObjectiveConfig.reward =
MAJORITY_VOTE); held-out metrics keep the true labels. docs/estimators.md section 6.

The pseudo-label follows the vote semantics of `majority_at_k` (section 3) on the whole
group of N:
  - answer ids >= 0 are classes; negative ids abstain and do not vote;
  - the winners are the classes with the most votes (the plurality, not a strict majority);
  - a tie among m winning classes is split: each sample in a winning class gets 1/m, the
    expected reward when the label is one of the m drawn uniformly (majority_at_k scores a
    tie 1/m in the same way), and the label counts as correct with weight 1/m;
  - a group where every sample abstains has no label: every reward is 0;
  - TTRL-style thresholding (`min_agreement` in [0, 1]): a group whose winners hold less
    than that fraction of all N samples (abstentions count in N) has no label either.
An all-zero group gives zero advantages under every estimator with a baseline, so the
groups without a label drop out of the update; the loop's step metrics count them.

What this optimises. The reward of sample i depends on the other samples through the vote,
so sum_i A_i grad log pi(y_i) with these rewards is the gradient of nothing simple: it
treats r_i as fixed and leaves out how y_i moves the label the others are scored against
(as TTRL does). Its fixed points include every policy that puts all its mass on one answer
(agreement 1), right or wrong, which is why the error rate of the label is worth watching.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kjax.objectives import _validate


def _winners(answers: jax.Array, min_agreement: float):
    """(in_winner [B, N] bool, tied [B] float, labelled [B] bool) of the group vote."""
    votes = answers >= 0
    same = (answers[:, :, None] == answers[:, None, :]) & votes[:, :, None] & votes[:, None, :]
    count = jnp.sum(same, axis=-1)  # [B, N] votes of each sample's class (0 if it abstains)
    top = jnp.max(count, axis=-1)  # [B]
    in_winner = votes & (count == top[:, None]) & (top[:, None] > 0)
    # Each winning class has `top` members among the samples: m = winners / top.
    tied = jnp.sum(in_winner, axis=-1) / jnp.maximum(top, 1)
    n = answers.shape[1]
    labelled = (top > 0) & (top >= min_agreement * n)
    return in_winner & labelled[:, None], tied, labelled


def _check_agreement(min_agreement) -> float:
    if isinstance(min_agreement, bool) or not isinstance(min_agreement, int | float):
        raise ValueError(f"`min_agreement` must be a float in [0, 1]; got {min_agreement!r}.")
    if not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"`min_agreement` must lie in [0, 1]; got {min_agreement!r}.")
    return float(min_agreement)


def majority_pseudo_rewards(
    answers: jax.Array, min_agreement: float = 0.0, dtype=jnp.float32
) -> jax.Array:
    """[B, N] rewards: 1/m when sample i's answer is one of the m classes with the most
    votes in its group, else 0; all 0 for a group with no label (module docstring).

    Args:
      answers: [B, N] int answer classes (negative: abstains).
      min_agreement: static float in [0, 1]; groups whose winners hold fewer than
        min_agreement * N votes get no label (TTRL-style thresholding). 0: every group
        with a vote is labelled.
      dtype: the rewards' float dtype.
    """
    answers = _validate.check_group(answers, "answers", "int")
    min_agreement = _check_agreement(min_agreement)
    in_winner, tied, _ = _winners(answers, min_agreement)
    reward = jnp.where(in_winner, 1.0 / jnp.maximum(tied, 1.0)[:, None], 0.0)
    return jax.lax.stop_gradient(reward.astype(dtype))


def pseudo_label_stats(
    answers: jax.Array, target: jax.Array, scores: jax.Array, min_agreement: float = 0.0
) -> dict[str, jax.Array]:
    """How good the vote's labels were, against the true labels (for logging only).

    Returns scalars:
      labelled: fraction of groups with a label;
      label_wrong: over the labelled groups, the mean of 1 - (weight of the true class
        among the winners), i.e. how often the label is wrong, a tie counting 1/m per class
        (nan when no group is labelled);
      reward_error: mean over all samples of |pseudo reward - true score|.

    answers [B, N] int, target [B] int (negative: no answer is correct), scores [B, N] the
    verifier's true rewards.
    """
    answers = _validate.check_group(answers, "answers", "int")
    min_agreement = _check_agreement(min_agreement)
    target = jnp.asarray(target)
    _validate.check_same_shape(target, "target", answers[:, 0], "answers[:, 0] (shape [B])")
    in_winner, tied, labelled = _winners(answers, min_agreement)
    target_wins = jnp.any(in_winner & (answers == target[:, None]) & (target[:, None] >= 0), -1)
    right = jnp.where(target_wins, 1.0 / jnp.maximum(tied, 1.0), 0.0)
    groups = jnp.sum(labelled)
    wrong = jnp.sum(jnp.where(labelled, 1.0 - right, 0.0)) / jnp.where(groups > 0, groups, jnp.nan)
    pseudo = majority_pseudo_rewards(answers, min_agreement, jnp.float32)
    error = jnp.mean(jnp.abs(pseudo - jnp.asarray(scores, jnp.float32)))
    return {"labelled": jnp.mean(labelled.astype(jnp.float32)), "label_wrong": wrong,
            "reward_error": error}  # fmt: skip
