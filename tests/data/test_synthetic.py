"""Generated tasks: determinism by seed, train/test disjointness, schema and solvability."""

import itertools
from fractions import Fraction

import pytest

from kjax.data import synthetic
from kjax.rewards import countdown

ARITH = synthetic.ArithSpec(digits=2, operands=3, test_fraction=0.2)
COUNTDOWN = synthetic.CountdownSpec(count=4, max_number=20, max_target=100, test_fraction=0.2)


def arith(split, seed, n=200):
    return list(synthetic.arith_problems(ARITH, split, seed, n))


def test_arith_is_deterministic_by_seed():
    assert arith(synthetic.Split.TRAIN, 3) == arith(synthetic.Split.TRAIN, 3)
    assert arith(synthetic.Split.TRAIN, 3) != arith(synthetic.Split.TRAIN, 4)


def test_arith_splits_are_disjoint_by_construction():
    train = {p["id"] for s in range(3) for p in arith(synthetic.Split.TRAIN, s)}
    test = {p["id"] for s in range(3) for p in arith(synthetic.Split.TEST, s)}
    assert train and test and not train & test


def test_arith_answers_match_an_independent_evaluator():
    for p in arith(synthetic.Split.TEST, 0, 100):
        text = p["question"].removeprefix("What is ").removesuffix("?")
        assert countdown.parse(text).value == p["answer"]
        assert isinstance(p["answer"], int) and len(text.split()) == 2 * ARITH.operands - 1


def test_arith_operators_config_is_respected():
    spec = synthetic.ArithSpec(digits=1, operands=2, operators=(synthetic.Operator.MUL,))
    for p in synthetic.arith_problems(spec, synthetic.Split.TRAIN, 0, 20):
        a, op, b = p["question"].removeprefix("What is ").removesuffix("?").split()
        assert op == "*" and p["answer"] == int(a) * int(b)


def test_arith_too_small_spec_is_a_clear_error():
    spec = synthetic.ArithSpec(digits=1, operands=2, operators=(synthetic.Operator.ADD,))
    with pytest.raises(ValueError, match="fewer than"):
        list(synthetic.arith_problems(spec, synthetic.Split.TRAIN, 0, 150))  # only 100 exist


def reachable(numbers):
    """Every value reachable using all numbers once (exhaustive over expression trees)."""
    if len(numbers) == 1:
        return {Fraction(numbers[0])}
    out = set()
    for r in range(1, len(numbers)):
        for left in set(itertools.combinations(range(len(numbers)), r)):
            lv = reachable([numbers[i] for i in left])
            rv = reachable([numbers[i] for i in range(len(numbers)) if i not in left])
            for a, b in itertools.product(lv, rv):
                out |= {a + b, a - b, a * b} | ({a / b} if b else set())
    return out


def test_countdown_puzzles_are_solvable_deterministic_and_disjoint():
    train = list(synthetic.countdown_problems(COUNTDOWN, synthetic.Split.TRAIN, 0, 15))
    assert train == list(synthetic.countdown_problems(COUNTDOWN, synthetic.Split.TRAIN, 0, 15))
    test = list(synthetic.countdown_problems(COUNTDOWN, synthetic.Split.TEST, 0, 15))
    assert not {p["id"] for p in train} & {p["id"] for p in test}
    for p in train[:8]:
        assert len(p["numbers"]) == 4 and 0 < p["target"] <= 100
        assert p["target"] in reachable(p["numbers"])


def test_countdown_solutions_reach_the_target_with_every_number_once():
    from kjax.rewards import countdown

    for p in synthetic.countdown_problems(COUNTDOWN, synthetic.Split.TRAIN, 0, 40):
        expr = countdown.parse(p["solution"])  # the verifier's own parser, not eval
        assert expr.value == p["target"], p
        assert sorted(expr.numbers) == sorted(p["numbers"]), p


def test_spec_validation():
    with pytest.raises(ValueError, match="operands >= 2"):
        synthetic.ArithSpec(operands=1)
    with pytest.raises(ValueError, match="test_fraction"):
        synthetic.CountdownSpec(test_fraction=0.0)
