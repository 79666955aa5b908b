"""Math verifier: extract the final answer (\\boxed{}, "The answer is", last number) and
decide equivalence with math-verify (fractions vs decimals, units, LaTeX forms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math_verify

from kjax.rewards.extract import final_answer
from kjax.rewards.pool import VerifierPool
from kjax.rewards.verdict import NO_ANSWER, AnswerClasses, PromptVerdict, Verdicts, stack

_CONFIG = (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())
TIMEOUT_S = 5  # math-verify's own per-call limit; the verifier pool adds a per-item one


def parse_answer(text: str | None) -> list[Any] | None:
    """Parses an answer string (LaTeX or plain) into math-verify's form; None if unparsable.

    math-verify reads math between $...$; the extracted string has no delimiters, and
    trailing sentence punctuation would make "1/2." a non-number.
    """
    if text is None:
        return None
    text = text.strip().rstrip(".,;! ").strip("$ ")
    if not text:
        return None
    parsed = math_verify.parse(f"${text}$", extraction_config=_CONFIG, parsing_timeout=TIMEOUT_S)
    return parsed or None


def extract(completion: str) -> list[Any] | None:
    """The parsed final answer of a completion, or None."""
    return parse_answer(final_answer(completion))


def equivalent(gold: list[Any], pred: list[Any]) -> bool:
    return bool(math_verify.verify(gold, pred, timeout_seconds=TIMEOUT_S))


def _key(parsed: list[Any]) -> str:
    return str(parsed[0])


def verify_prompt(completions: Sequence[str], reference: str) -> PromptVerdict:
    """completions: [N] strings; reference: the answer string (e.g. "\\frac{1}{2}")."""
    gold = parse_answer(reference)
    if gold is None:
        raise ValueError(
            f"math reference answer {reference!r} cannot be parsed; fix the "
            "dataset row (a reference must be a LaTeX or plain math expression)."
        )
    classes = AnswerClasses(gold, equivalent=equivalent, key=_key)
    answers = [extract(c) for c in completions]
    ids = [classes.id_of(a) for a in answers]
    return PromptVerdict(scores=[float(i == 0) for i in ids], answer_ids=ids)


def _verify_item(item: tuple[Sequence[str], str]) -> PromptVerdict:
    return verify_prompt(*item)


def verify(
    completions: Sequence[Sequence[str]],
    references: Sequence[str],
    *,
    pool: VerifierPool | None = None,
) -> Verdicts:
    """completions: [B][N] strings; references: [B] answer strings. Returns [B, N] verdicts.

    A sample scores 1 exactly when its answer falls in the reference's class (id 0). With
    `pool`, prompts are verified in parallel; a prompt that times out scores 0 with no
    answers.
    """
    if len(completions) != len(references):
        raise ValueError(
            f"math.verify: {len(completions)} prompts but {len(references)} "
            "references; pass one reference answer per prompt."
        )
    items = [(list(c), r) for c, r in zip(completions, references, strict=True)]
    rows = pool.map(_verify_item, items, default=None) if pool else map(_verify_item, items)
    return stack(
        [
            row if row is not None else PromptVerdict([0.0] * len(c), [NO_ANSWER] * len(c))
            for row, (c, _) in zip(rows, items, strict=True)
        ]
    )
