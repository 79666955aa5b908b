"""Countdown verifier: parse the arithmetic expression with a small safe parser (never
`eval`), check the numbers used and the value; near misses earn a continuous reward."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from kjax.rewards.extract import answer_is, last_boxed
from kjax.rewards.verdict import AnswerClasses, PromptVerdict, Verdicts, stack

MAX_EXPRESSION_CHARS = 256  # bounds parse time and recursion depth on hostile input
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class NumberUse(enum.Enum):
    EXACTLY_ONCE = "exactly_once"  # every given number, each once (the usual Countdown rule)
    AT_MOST_ONCE = "at_most_once"  # any subset of the given numbers, each at most once


@dataclasses.dataclass(frozen=True)
class CountdownReward:
    """Reward shape. A valid expression off by d scores
    near_miss_weight * max(0, 1 - d / near_miss_range); an exact hit scores 1."""

    number_use: NumberUse = NumberUse.EXACTLY_ONCE
    near_miss_weight: float = 0.5
    near_miss_range: float = 10.0

    def __post_init__(self):
        if not 0.0 <= self.near_miss_weight < 1.0:
            raise ValueError(
                "CountdownReward.near_miss_weight must be in [0, 1) so an exact "
                f"hit beats a near miss; got {self.near_miss_weight}."
            )
        if self.near_miss_range <= 0:
            raise ValueError(f"near_miss_range must be > 0; got {self.near_miss_range}.")


@dataclasses.dataclass(frozen=True)
class Expression:
    value: Fraction
    numbers: tuple[int, ...]  # the literals used, in order


class ParseError(ValueError):
    pass


def parse(text: str) -> Expression:
    """Parses `+ - * / ( )` over non-negative integer literals into an exact value.

    Raises ParseError on anything else (names, calls, unary minus, exponentiation,
    division by zero, over-long input).
    """
    text = (
        text.replace("×", "*")
        .replace("÷", "/")
        .replace("\\times", "*")
        .replace("\\div", "/")
        .strip()
    )
    if not text or len(text) > MAX_EXPRESSION_CHARS:
        raise ParseError(f"expression empty or longer than {MAX_EXPRESSION_CHARS} chars")
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise ParseError(f"unexpected character {text[pos]!r} at {pos}")
        tokens.append(int(m.group(1)) if m.group(1) else m.group(2))
        pos = m.end()
    numbers: list[int] = []
    value, rest = _sum(tokens, numbers)
    if rest:
        raise ParseError(f"unexpected {rest[0]!r} after a complete expression")
    return Expression(value=value, numbers=tuple(numbers))


def _sum(tokens, numbers):
    value, tokens = _product(tokens, numbers)
    while tokens and tokens[0] in ("+", "-"):
        op, (rhs, tokens) = tokens[0], _product(tokens[1:], numbers)
        value = value + rhs if op == "+" else value - rhs
    return value, tokens


def _product(tokens, numbers):
    value, tokens = _atom(tokens, numbers)
    while tokens and tokens[0] in ("*", "/"):
        op, (rhs, tokens) = tokens[0], _atom(tokens[1:], numbers)
        if op == "/" and rhs == 0:
            raise ParseError("division by zero")
        value = value * rhs if op == "*" else value / rhs
    return value, tokens


def _atom(tokens, numbers):
    if not tokens:
        raise ParseError("expression ends early")
    head = tokens[0]
    if isinstance(head, int):
        numbers.append(head)
        return Fraction(head), tokens[1:]
    if head == "(":
        value, tokens = _sum(tokens[1:], numbers)
        if not tokens or tokens[0] != ")":
            raise ParseError("unbalanced parenthesis")
        return value, tokens[1:]
    raise ParseError(f"expected a number or '(' but got {head!r}")


def extract_expression(completion: str) -> str | None:
    """The expression a completion answers: <answer> tag, \\boxed{}, "answer is", or the
    last non-empty line; a trailing "= value" is dropped."""
    tags = _ANSWER_TAG.findall(completion)
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    found = (tags[-1] if tags else None) or last_boxed(completion) or answer_is(completion)
    found = found if found is not None else (lines[-1] if lines else None)
    if found is None:
        return None
    return found.split("=")[0].strip().strip("$").strip() or None


def uses_allowed_numbers(used: Sequence[int], given: Sequence[int], rule: NumberUse) -> bool:
    used_c, given_c = Counter(used), Counter(given)
    if rule is NumberUse.EXACTLY_ONCE:
        return used_c == given_c
    return all(used_c[n] <= given_c[n] for n in used_c)


def score_expression(
    expr: Expression, numbers: Sequence[int], target: int, reward: CountdownReward
) -> float:
    if not uses_allowed_numbers(expr.numbers, numbers, reward.number_use):
        return 0.0
    if expr.value == target:
        return 1.0
    miss = float(abs(expr.value - target))
    return reward.near_miss_weight * max(0.0, 1.0 - miss / reward.near_miss_range)


def verify_prompt(
    completions: Sequence[str],
    numbers: Sequence[int],
    target: int,
    reward: CountdownReward = CountdownReward(),
) -> PromptVerdict:
    """completions: [N] strings for one puzzle (numbers, target).

    Answer classes: a valid expression's class is its value (all correct expressions share
    the reference class); an expression misusing the numbers is a class of its own per
    value; an unparsable completion has no answer (-1).
    """
    classes = AnswerClasses(
        ("valid", Fraction(target)), equivalent=lambda a, b: a == b, key=lambda a: a
    )
    scores, ids = [], []
    for completion in completions:
        text = extract_expression(completion)
        try:
            expr = parse(text) if text is not None else None
        except ParseError:
            expr = None
        if expr is None:
            scores.append(0.0)
            ids.append(classes.id_of(None))
            continue
        valid = uses_allowed_numbers(expr.numbers, numbers, reward.number_use)
        scores.append(score_expression(expr, numbers, target, reward))
        ids.append(classes.id_of(("valid" if valid else "invalid", expr.value)))
    return PromptVerdict(scores=scores, answer_ids=ids)


def verify(
    completions: Sequence[Sequence[str]],
    numbers: Sequence[Sequence[int]],
    targets: Sequence[int],
    reward: CountdownReward = CountdownReward(),
) -> Verdicts:
    """completions: [B][N]; numbers: [B] lists of given numbers; targets: [B]."""
    if not len(completions) == len(numbers) == len(targets):
        raise ValueError(
            f"countdown.verify: {len(completions)} prompts, {len(numbers)} "
            f"number lists, {len(targets)} targets; need one of each per prompt."
        )
    return stack(
        [
            verify_prompt(c, n, t, reward)
            for c, n, t in zip(completions, numbers, targets, strict=True)
        ]
    )
