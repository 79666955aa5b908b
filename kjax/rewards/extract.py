"""Final-answer extraction from a completion: \\boxed{...}, then "The answer is ...",
then the last number in the text. Shared by the math and arithmetic verifiers."""

from __future__ import annotations

import re

_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)
# Thousands separators only in groups of three, so "1,2" stays two numbers.
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Returns the content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip() or None
    return None  # unbalanced: the completion was cut off inside the box


def answer_is(text: str) -> str | None:
    """Returns what follows the last "answer is" / "answer:" up to the end of its line."""
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    found = matches[-1].group(1).split("\n")[0].strip()
    # Sentence punctuation is not part of the answer ("The answer is 5." -> "5").
    found = found.rstrip(" .;,!").strip("$ ").strip()
    return found or None


def last_number(text: str) -> str | None:
    """Returns the last number in the text ("1,000" -> "1000"), or None."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def final_answer(text: str) -> str | None:
    """The answer string of a completion, by priority: boxed, "answer is", last number."""
    for extract in (last_boxed, answer_is, last_number):
        found = extract(text)
        if found is not None:
            return found
    return None
