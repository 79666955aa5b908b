"""Generated tasks: arithmetic and Countdown problems, deterministic by seed.

A problem belongs to the test split iff a hash of its text says so, so train and test
are disjoint by construction (never two draws that happen not to collide).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import random
from collections.abc import Iterator
from fractions import Fraction


class Operator(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"


class Split(enum.Enum):
    TRAIN = "train"
    TEST = "test"


@dataclasses.dataclass(frozen=True)
class ArithSpec:
    """Arithmetic problems like "What is 38 + 7 * 12?" with an integer answer."""

    digits: int = 2  # each operand has 1..digits digits
    operands: int = 3
    operators: tuple[Operator, ...] = (Operator.ADD, Operator.SUB, Operator.MUL)
    test_fraction: float = 0.1

    def __post_init__(self):
        if self.digits < 1 or self.operands < 2 or not self.operators:
            raise ValueError(
                f"ArithSpec needs digits >= 1, operands >= 2 and an operator; got {self}."
            )
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1); got {self.test_fraction}.")


@dataclasses.dataclass(frozen=True)
class CountdownSpec:
    """Countdown: combine the given numbers with + - * / to reach the target."""

    count: int = 4  # numbers per puzzle
    max_number: int = 50
    max_target: int = 200
    test_fraction: float = 0.1

    def __post_init__(self):
        if self.count < 2 or self.max_number < 1 or self.max_target < 1:
            raise ValueError(f"CountdownSpec needs count >= 2 and positive ranges; got {self}.")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1); got {self.test_fraction}.")


def split_of(key: str, test_fraction: float) -> Split:
    """The split a problem belongs to, from a stable hash of its canonical text."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64
    return Split.TEST if h < test_fraction else Split.TRAIN


def _evaluate(numbers: list[int], ops: list[Operator]) -> int:
    """Usual precedence (* before + and -), left to right otherwise."""
    terms, signs = [numbers[0]], []
    for op, n in zip(ops, numbers[1:], strict=True):
        if op is Operator.MUL:
            terms[-1] *= n
        else:
            terms.append(n)
            signs.append(op)
    total = terms[0]
    for op, t in zip(signs, terms[1:], strict=True):
        total = total + t if op is Operator.ADD else total - t
    return total


def arith_problems(spec: ArithSpec, split: Split, seed: int, count: int) -> Iterator[dict]:
    """Yields `count` distinct problems of `split`: {"id", "question", "answer": int}."""
    rng = random.Random(f"arith/{seed}")
    seen: set[str] = set()
    for _ in range(count * 1000):  # bounded: a tiny spec may have too few problems
        numbers = [rng.randint(0, 10**spec.digits - 1) for _ in range(spec.operands)]
        ops = [rng.choice(spec.operators) for _ in range(spec.operands - 1)]
        text = " ".join(
            [str(numbers[0])] + [f"{o.value} {n}" for o, n in zip(ops, numbers[1:], strict=True)]
        )
        if text in seen or split_of(text, spec.test_fraction) is not split:
            continue
        seen.add(text)
        yield {
            "id": f"arith-{text}",
            "question": f"What is {text}?",
            "answer": _evaluate(numbers, ops),
        }
        if len(seen) == count:
            return
    raise ValueError(
        f"ArithSpec {spec} has fewer than {count} distinct {split.value} "
        "problems; raise digits or operands, or ask for fewer."
    )


def solvable_target(
    numbers: list[int], max_target: int, rng: random.Random
) -> tuple[int, str] | None:
    """(a positive integer reachable using every number once, an expression reaching it),
    chosen by `rng`, or None. The expression combines the numbers left to right, with the
    parentheses that order needs ("(3+5)*2-7")."""
    order = numbers[:]
    rng.shuffle(order)
    value, text, last = Fraction(order[0]), str(order[0]), None
    for n in order[1:]:
        options = [(value + n, "+"), (value * n, "*"), (value - n, "-")]
        if n != 0:
            options.append((value / n, "/"))
        value, op = rng.choice(options)
        if op in "*/" and last in ("+", "-"):  # the running sum binds first
            text = f"({text})"
        text, last = f"{text}{op}{n}", op
    if value.denominator == 1 and 0 < value <= max_target:
        return int(value), text
    return None


def countdown_problems(spec: CountdownSpec, split: Split, seed: int, count: int) -> Iterator[dict]:
    """Yields `count` distinct solvable puzzles: {"id", "numbers": [int], "target": int,
    "solution": str}, the solution being the expression the generator built the target
    from (one of possibly many)."""
    rng = random.Random(f"countdown/{seed}")
    seen: set[str] = set()
    for _ in range(count * 1000):  # bounded, as for arithmetic
        numbers = sorted(rng.randint(1, spec.max_number) for _ in range(spec.count))
        found = solvable_target(numbers, spec.max_target, rng)
        target, solution = found if found is not None else (None, "")
        key = f"{numbers} -> {target}"
        if target is None or key in seen or split_of(key, spec.test_fraction) is not split:
            continue
        seen.add(key)
        yield {"id": f"countdown-{key}", "numbers": numbers, "target": target, "solution": solution}
        if len(seen) == count:
            return
    raise ValueError(
        f"CountdownSpec {spec} has too few distinct solvable {split.value} "
        f"puzzles for {count}; widen max_number or max_target, or ask for fewer."
    )
