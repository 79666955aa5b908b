"""Countdown: the safe expression parser, number-use rules and the near-miss reward."""

import builtins
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kjax.rewards import countdown as cd


@pytest.mark.parametrize(
    ("text", "value", "numbers"),
    [
        ("2+3*4", 14, (2, 3, 4)),
        ("(2+3)*4", 20, (2, 3, 4)),
        ("7/2*2", 7, (7, 2, 2)),
        ("10-4-3", 3, (10, 4, 3)),
        ("8/(3-1)", 4, (8, 3, 1)),
        ("6 × 7", 42, (6, 7)),
        ("((((5))))", 5, (5,)),
    ],
)
def test_parse_values_exactly(text, value, numbers):
    expr = cd.parse(text)
    assert expr.value == value and expr.numbers == numbers


@pytest.mark.parametrize(
    "text",
    [
        "2**3",
        "__import__('os').system('true')",
        "-3+5",
        "1/0",
        "2+",
        "(1+2",
        "1 2",
        "abs(3)",
        "1e3",
        "(" * 200 + "1" + ")" * 200,
        "",
    ],
)
def test_parse_rejects(text):
    with pytest.raises(cd.ParseError):
        cd.parse(text)


def test_parse_never_calls_eval(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    assert cd.parse("(1+2)*3").value == 9


@st.composite
def trees(draw, depth=0):
    if depth >= 3 or draw(st.booleans()):
        n = draw(st.integers(0, 50))
        return str(n), Fraction(n)
    (lt, lv), (rt, rv) = draw(trees(depth + 1)), draw(trees(depth + 1))
    op = draw(st.sampled_from("+-*/" if rv != 0 else "+-*"))
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
    return f"({lt}{op}{rt})", value


@settings(max_examples=60, deadline=None)
@given(trees())
def test_parse_matches_the_tree_it_was_built_from(tree):
    text, value = tree
    assert cd.parse(text).value == value


def test_number_rules():
    assert cd.uses_allowed_numbers([1, 2, 4], [4, 2, 1], cd.NumberUse.EXACTLY_ONCE)
    assert not cd.uses_allowed_numbers([1, 2], [4, 2, 1], cd.NumberUse.EXACTLY_ONCE)
    assert cd.uses_allowed_numbers([1, 2], [4, 2, 1], cd.NumberUse.AT_MOST_ONCE)
    assert not cd.uses_allowed_numbers([2, 2], [4, 2, 1], cd.NumberUse.AT_MOST_ONCE)


def test_scores_and_answer_classes():
    numbers, target = [1, 2, 4], 12
    completions = [
        "(1+2)*4",  # 12: correct
        "<answer>4*(2+1)</answer>",  # 12: another correct expression, same class
        "1+2+4",  # 7: off by 5 -> 0.5 * (1 - 5/10) = 0.25
        "garbage",  # no answer
        "\\boxed{4+2+1 = 7}",  # 7 again, same class as "1+2+4"
        "(1+2)*4*1",  # 12 but uses 1 twice: invalid -> 0, its own class
        "1*2*4 + 3",  # 11 but uses 3: invalid
        "(4-1)*2*2",  # 12 but uses 2 twice: invalid, same class as the other invalid 12
        "4*2+1",  # 9: off by 3 -> 0.5 * 0.7 = 0.35
    ]
    v = cd.verify([completions], [numbers], [target])
    assert v.scores[0].tolist() == pytest.approx([1, 1, 0.25, 0, 0.25, 0, 0, 0, 0.35])
    assert v.answer_ids[0].tolist() == [0, 0, 1, -1, 1, 2, 3, 2, 4]


def test_far_miss_scores_zero_and_weight_validated():
    v = cd.verify([["1*2*4"]], [[1, 2, 4]], [100])
    assert v.scores.tolist() == [[0.0]]
    with pytest.raises(ValueError, match="near_miss_weight"):
        cd.CountdownReward(near_miss_weight=1.0)
