"""TTRL's label-free rewards (kjax.objectives.pseudo_label; docs/estimators.md section 6).

The reference counts votes with Python's Counter, group by group, so it shares no code
with the vectorised version; cases are exhaustive over small groups (every answer vector
of length N over 3 classes and abstention), ties and thresholds included.
"""

import itertools
from collections import Counter

import jax
import numpy as np
import pytest

from kjax import objectives as obj


def vote_ref(row, min_agreement=0.0):
    """(rewards [N], winners set or None): plurality winners of one group, ties split."""
    votes = Counter(a for a in row if a >= 0)
    if not votes:
        return [0.0] * len(row), None
    top = max(votes.values())
    if top < min_agreement * len(row):
        return [0.0] * len(row), None
    winners = {a for a, c in votes.items() if c == top}
    return [1.0 / len(winners) if a in winners else 0.0 for a in row], winners


def all_groups(n):
    return np.array(list(itertools.product([-1, 0, 1, 2], repeat=n)), np.int32)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("min_agreement", [0.0, 0.5, 0.7, 1.0])
def test_rewards_match_a_vote_count_on_every_group(n, min_agreement):
    answers = all_groups(n)
    got = np.asarray(obj.majority_pseudo_rewards(answers, min_agreement))
    want = np.array([vote_ref(row, min_agreement)[0] for row in answers.tolist()])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert got.dtype == np.float32


def test_ties_abstentions_and_threshold_by_hand():
    answers = np.array(
        [
            [3, 3, 7, -1],  # plurality 3: two votes
            [3, 7, -1, -1],  # tie between 3 and 7: 1/2 each
            [-1, -1, -1, -1],  # nobody votes: no label
            [5, 5, 5, 9],  # 3 of 4 agree
        ],
        np.int32,
    )
    np.testing.assert_allclose(
        obj.majority_pseudo_rewards(answers),
        [[1, 1, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]],
    )
    # min_agreement = 0.6: only the last group's winner holds >= 60% of the 4 samples.
    np.testing.assert_allclose(
        obj.majority_pseudo_rewards(answers, 0.6),
        [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]],
    )


@pytest.mark.parametrize("min_agreement", [0.0, 0.5])
def test_label_stats_match_the_reference(min_agreement):
    rng = np.random.default_rng(0)
    answers = rng.integers(-1, 3, size=(64, 5)).astype(np.int32)
    target = rng.integers(-1, 3, size=64).astype(np.int32)
    scores = ((answers == target[:, None]) & (target[:, None] >= 0)).astype(np.float32)
    got = {
        k: float(v)
        for k, v in obj.pseudo_label_stats(answers, target, scores, min_agreement).items()
    }
    labelled, wrong, error = [], [], []
    for row, t, s in zip(answers.tolist(), target.tolist(), scores, strict=True):
        rewards, winners = vote_ref(row, min_agreement)
        error.append(np.mean(np.abs(np.array(rewards) - s)))
        labelled.append(winners is not None)
        if winners is not None:
            wrong.append(1 - (1 / len(winners) if t >= 0 and t in winners else 0.0))
    assert got["labelled"] == pytest.approx(np.mean(labelled), abs=1e-7)
    assert got["label_wrong"] == pytest.approx(np.mean(wrong), abs=1e-6)
    assert got["reward_error"] == pytest.approx(np.mean(error), abs=1e-6)
    assert 0 < got["label_wrong"] < 1


def test_no_labelled_group_gives_nan_error_rate_and_jit_matches_eager():
    answers = np.full((2, 3), -1, np.int32)
    stats = obj.pseudo_label_stats(answers, np.zeros(2, np.int32), np.zeros((2, 3), np.float32))
    assert float(stats["labelled"]) == 0 and np.isnan(float(stats["label_wrong"]))
    rows = all_groups(4)
    eager = obj.majority_pseudo_rewards(rows, 0.5)
    jitted = jax.jit(obj.majority_pseudo_rewards, static_argnums=1)(rows, 0.5)
    np.testing.assert_array_equal(eager, jitted)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: obj.majority_pseudo_rewards(np.zeros((2, 3), np.float32)), "answers"),
        (lambda: obj.majority_pseudo_rewards(np.zeros((2, 3), np.int32), 1.5), "min_agreement"),
        (lambda: obj.majority_pseudo_rewards(np.zeros((2, 3), np.int32), True), "min_agreement"),
        (lambda: obj.majority_pseudo_rewards(np.zeros(3, np.int32)), "answers"),
        (
            lambda: obj.pseudo_label_stats(
                np.zeros((2, 3), np.int32), np.zeros(3, np.int32), np.zeros((2, 3))
            ),
            "target",
        ),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
