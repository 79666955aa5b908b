"""Math answer extraction and equivalence (math-verify), table-driven."""

import pytest

from kjax.rewards import math as math_rewards
from kjax.rewards.extract import final_answer

# (reference answer, completion, correct?)
EQUIVALENCE = [
    ("\\frac{1}{2}", "Dividing, the answer is 0.5.", True),  # fraction vs decimal
    ("0.5", "So we get \\boxed{\\frac{1}{2}}.", True),  # decimal vs fraction
    ("\\frac{1}{2}", "\\boxed{\\dfrac12}", True),  # LaTeX variants
    ("5", "The length is \\boxed{5\\text{ cm}}", True),  # units
    ("5", "Therefore the answer is 5.", True),  # trailing punctuation
    ("1000", "She pays 1,000 dollars in total", True),  # thousands separator, last number
    ("72", "48 + 24 = 72\n#### 72", True),  # GSM8K style
    ("x^2+2x", "\\boxed{x(x+2)}", True),  # symbolic
    ("2", "\\boxed{3}", False),  # wrong
    ("4", "I think \\boxed{4}. Check: 2 + 5 = 7", True),  # boxed beats the last number
    ("3", "I cannot solve this.", False),  # no answer
    ("3", "\\boxed{3", True),  # cut off inside the box: falls back to the last number
]


@pytest.mark.parametrize(("reference", "completion", "correct"), EQUIVALENCE)
def test_equivalence_table(reference, completion, correct):
    v = math_rewards.verify([[completion]], [reference])
    assert v.scores.tolist() == [[float(correct)]]
    assert (v.answer_ids[0, 0] == v.target[0]) == correct


def test_cut_off_box_uses_last_number():
    assert final_answer("\\boxed{3") == "3"


def test_answer_classes_group_equivalent_answers():
    completions = [
        "\\boxed{1/2}",
        "The answer is 0.5",
        "\\boxed{3}",
        "so 3",
        "no idea",
        "\\boxed{\\frac{6}{2}}",
    ]
    v = math_rewards.verify([completions], ["\\frac12"])
    assert v.answer_ids.tolist() == [[0, 0, 1, 1, -1, 1]]
    assert v.scores.tolist() == [[1, 1, 0, 0, 0, 0]]


def test_unparsable_reference_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot be parsed"):
        math_rewards.verify([["1"]], ["   "])
