"""Arithmetic verifier: exact integer answers."""

import pytest

from kjax.rewards import arith


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("12 + 30 = 42", 42),
        ("The answer is -7.", -7),
        ("\\boxed{1,234}", 1234),
        ("\\boxed{x = 12}", 12),
        ("about 3.5", None),
        ("no idea", None),
        ("", None),
    ],
)
def test_parse_int(completion, expected):
    assert arith.parse_int(completion) == expected


def test_verify_scores_and_classes():
    v = arith.verify([["so 42", "41", "\\boxed{42}", "hmm", "41"]], [42])
    assert v.scores.tolist() == [[1, 0, 1, 0, 0]]
    assert v.answer_ids.tolist() == [[0, 1, 0, -1, 1]]
    assert v.target.tolist() == [0]


def test_mismatched_batch_is_an_error():
    with pytest.raises(ValueError, match="one reference per prompt"):
        arith.verify([["1"], ["2"]], [1])
