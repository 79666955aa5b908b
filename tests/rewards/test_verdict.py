"""The verifier output contract and answer-class numbering."""

import numpy as np
import pytest

from kjax.rewards.verdict import NO_ANSWER, AnswerClasses, PromptVerdict, Verdicts, stack


def test_reference_is_class_zero_and_others_number_by_first_appearance():
    classes = AnswerClasses(10, equivalent=lambda a, b: a == b, key=lambda a: a)
    ids = [classes.id_of(a) for a in [7, 10, None, 7, 3, 10]]
    assert ids == [1, 0, NO_ANSWER, 1, 2, 0]


def test_equivalence_runs_once_per_distinct_key():
    calls = []

    def equivalent(a, b):
        calls.append((a, b))
        return a % 5 == b % 5

    classes = AnswerClasses(0, equivalent=equivalent, key=lambda a: a)
    assert [classes.id_of(a) for a in [5, 5, 5, 1, 6, 1]] == [0, 0, 0, 1, 1, 1]
    # 5 vs rep 0; 1 vs reps 0 (no); 6 vs reps 0 (no), 1 (yes). Repeats hit the key cache.
    assert calls == [(0, 5), (0, 1), (0, 6), (1, 6)]


def test_unparsable_reference_still_gives_target_class_zero():
    classes = AnswerClasses(None, equivalent=lambda a, b: a == b, key=lambda a: a)
    assert [classes.id_of(a) for a in [4, 4, 2]] == [1, 1, 2]


def test_stack_shapes_and_dtypes():
    v = stack([PromptVerdict([1.0, 0.0], [0, -1]), PromptVerdict([0.5, 0.0], [1, 1])])
    assert v.scores.shape == (2, 2) and v.scores.dtype == np.float32
    assert v.answer_ids.dtype == np.int32 and v.target.tolist() == [0, 0]
    with pytest.raises(ValueError, match="same number of samples"):
        stack([PromptVerdict([1.0], [0]), PromptVerdict([1.0, 0.0], [0, 0])])


def test_verdicts_reject_out_of_range_scores():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Verdicts(
            np.full((1, 2), 1.5, np.float32), np.zeros((1, 2), np.int32), np.zeros((1,), np.int32)
        )
