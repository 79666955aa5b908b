"""Arithmetic verifier: the final answer must be exactly the reference integer."""

from __future__ import annotations

import re
from collections.abc import Sequence

from kjax.rewards.extract import final_answer, last_number
from kjax.rewards.verdict import AnswerClasses, PromptVerdict, Verdicts, stack

_INT = re.compile(r"[+-]?\d+")


def parse_int(completion: str) -> int | None:
    """The integer a completion answers, or None (non-integers are no answer)."""
    text = final_answer(completion)
    if text is None:
        return None
    text = text.replace(",", "").replace(" ", "").strip("$")
    if not _INT.fullmatch(text):
        # e.g. "\boxed{x = 12}": fall back to the last number inside the answer.
        text = last_number(text) or ""
    return int(text) if _INT.fullmatch(text) else None


def verify_prompt(completions: Sequence[str], reference: int) -> PromptVerdict:
    """completions: [N] strings for one prompt; reference: the correct integer."""
    classes = AnswerClasses(int(reference), equivalent=lambda a, b: a == b, key=lambda a: a)
    answers = [parse_int(c) for c in completions]
    return PromptVerdict(
        scores=[float(a is not None and a == reference) for a in answers],
        answer_ids=[classes.id_of(a) for a in answers],
    )


def verify(completions: Sequence[Sequence[str]], references: Sequence[int]) -> Verdicts:
    """completions: [B][N] strings; references: [B] ints. Returns `Verdicts` [B, N]."""
    if len(completions) != len(references):
        raise ValueError(
            f"arith.verify: {len(completions)} prompts of completions but "
            f"{len(references)} references; pass one reference per prompt."
        )
    return stack([verify_prompt(c, r) for c, r in zip(completions, references, strict=True)])
