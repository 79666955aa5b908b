"""Verifier output feeds kjax.objectives.majority_at_k directly (answer ids + target)."""

import numpy as np

from kjax.objectives import majority
from kjax.rewards import arith


def test_arith_verdicts_drive_majority_voting():
    # 2 correct (42), 3 votes for 41, 1 abstention.
    v = arith.verify([["42", "\\boxed{41}", "so 41", "42", "41", "no idea"]], [42])
    assert v.answer_ids.tolist() == [[0, 1, 1, 0, 1, -1]]
    # k=1: a single vote is correct with probability 2/6 (an abstaining draw scores 0).
    np.testing.assert_allclose(
        majority.majority_at_k(v.answer_ids, v.target, 1), [2 / 6], rtol=1e-5
    )
    # k=6: all votes, 41 wins 3 to 2.
    np.testing.assert_allclose(majority.majority_at_k(v.answer_ids, v.target, 6), [0.0], atol=1e-6)
