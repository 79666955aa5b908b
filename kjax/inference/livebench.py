"""Scorers for the LiveBench tasks whose ground truth can be checked offline (math, reasoning).

Each follows the published rule of the LiveBench repository (livebench/process_results),
reimplemented here: where an answer is looked for, in what order, and what counts as a
match. A score is in [0, 1]; an answer that is malformed (no extractable answer, not a
string, hostile input) scores 0 and never raises. A malformed *question* (e.g. an AMC
ground truth that is not a letter A-E) raises ValueError: that is a dataset error.
Deviations, on purpose: AMPS_Hard equivalence uses math-verify (kjax.rewards.math) instead
of sympy's lark LaTeX parser; web-of-lies counts yes/no/unknown as whole words (LiveBench's
substring count sees a "no" inside "unknown").
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

from kjax.rewards.extract import last_boxed

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_SOLUTION = re.compile(r"<solution>(.*?)</solution>")
_SOLUTION_BROKEN = re.compile(r"</solution>(.*?)</solution>")  # a model's mistyped open tag
_MAX_CHARS = 200_000  # longer answers are cut to their tail: bounds regex time
_NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen "
_NUMBER_WORDS += "fourteen fifteen sixteen seventeen eighteen nineteen twenty"
WORD_TO_NUMBER = {w: str(i) for i, w in enumerate(_NUMBER_WORDS.split())}
ZEBRA_V2_RELEASE = "2024-11-25"  # zebra puzzles from this release on use <solution> lists


def _boxed(text: str) -> str | None:
    """The last \\boxed{...} content, \\fbox read as \\boxed (LiveBench's util)."""
    return last_boxed(text.replace("\\fbox{", "\\boxed{"))


def math_contest(ground_truth: str, answer: str, question: str) -> float:
    """AMC/SMC multiple choice: the letter in <solution>, repeated 4+ times (the prompt asks
    for 5), \\boxed{letter}, or the option's value among the answer's last characters."""
    if not (
        isinstance(ground_truth, str) and len(ground_truth) == 1 and "A" <= ground_truth <= "E"
    ):
        raise ValueError(f"AMC ground_truth must be one letter A-E; got {ground_truth!r}.")
    tags = _SOLUTION.findall(answer)
    if tags and len(set(tags[-1])) == 1 and tags[-1][0].lower() == ground_truth.lower():
        return 1.0
    if ground_truth * 4 in answer:
        return 1.0
    boxed = _boxed(answer)
    if boxed is not None:
        letter = boxed.replace("\\text{", "").replace("}", "").replace("\\", "").lower()
        if letter == ground_truth.lower():
            return 1.0
    value = _option_value(question, ground_truth)
    return float(value is not None and value in answer[-(20 + len(value)) :])


def _option_value(question: str, letter: str) -> str | None:
    """The text of option `letter` in an AMC question ("\\textbf{(B) } 12 \\qquad...")."""
    options = re.findall(r"\\textbf{\(([A-E])\)\s?}(.*?)(?:\\qquad|\$)", question)
    value = {k: v.strip() for k, v in options}.get(letter, "")
    return value.strip("$").strip("~") or None


def aime(ground_truth: str, answer: str) -> float:
    """AIME: the integer answer appears among the last 50 characters."""
    return float(str(ground_truth) in answer[-50:])


def _normalize_final_answer(text: str) -> str:
    """Lewkowycz et al. (2022) appendix D normalization, as LiveBench's AMPS_Hard uses it."""
    text = text.split("=")[-1]
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text)
    for macro in ("text", "textbf", "overline"):
        text = re.sub(rf"(\\{macro}\{{)(.*?)(\}})", "\\2", text)
    text = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)
    text = re.sub(r"(sqrt)([^{\[])", "sqrt{\\2}", text)
    text = text.replace("$", "")
    return text.replace(",", "") if text.replace(",", "").isdigit() else text


_AMPS_DROP = (
    "+C",
    "+ C",
    "+ c",
    "+c",
    "\\left",
    "\\right",
    "\\bigl",
    "\\bigr",
    "\\Bigl",
    "\\Bigr",
    "\\,",
    "\\;",
    "\n",
)


def amps_hard(ground_truth: str, answer: str) -> float:
    """AMPS_Hard: the last \\boxed{} (else the last $...$ of the last line), normalized,
    is mathematically equivalent to the ground truth; with neither, the answer must end
    with the ground truth verbatim."""
    from kjax.rewards import math as math_rewards  # math-verify is slow to import

    for drop in _AMPS_DROP:
        answer = answer.replace(drop, "")
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = answer.replace("\\cdot", "*")
    gt = ground_truth.replace("\\left", "").replace("\\right", "").replace(" ^", "^")
    gt = gt.replace("\\ ", "*")
    boxed = _boxed(answer)
    parsed = _normalize_final_answer(boxed) if boxed is not None else None
    line = answer.split("\n")[-1]
    if parsed is None and line.count("$") >= 2:
        close = line.rfind("$")
        close -= 1 if line[close - 1] == "$" else 0
        inner = line[line.rfind("$", 0, close) + 1 : close]
        inner = inner.split("=")[-1].strip() if "=" in inner else inner
        parsed = _normalize_final_answer(inner.split("\\quad \\text{or} \\quad")[-1].strip())
    if parsed is None:
        tail = answer[:-1] if answer.endswith(".") else answer
        return float(bool(gt) and tail.endswith(gt))
    gold, pred = math_rewards.parse_answer(gt), math_rewards.parse_answer(parsed)
    return float(gold is not None and pred is not None and math_rewards.equivalent(gold, pred))


def web_of_lies(ground_truth: str, answer: str) -> float:
    """Three yes/no/unknown verdicts: <solution>, else the last three bold verdict words,
    else \\boxed{}, else the last "x, y, z" triple in the text."""
    found = None
    tags = _SOLUTION.findall(answer) or _SOLUTION_BROKEN.findall(answer)
    if tags:
        found = tags[-1]
    bold = re.findall(r"\*\*(.*?)\*\*", answer)
    if found is None and bold:
        words = [
            w.lower().strip().replace(",", "").replace(".", "") for b in bold for w in b.split()
        ]
        verdicts = [w for w in words if w in ("yes", "no", "unknown")][-3:]
        found = ", ".join(verdicts) or None
    if found is None or not found.strip():
        boxed = _boxed(answer.replace("\\textbf{", "\\boxed{"))
        found = boxed if boxed is not None else found
    if found is None:
        lower, at = answer.lower(), -1
        for combo in itertools.product(("yes", "no", "unknown"), repeat=3):
            i = lower.rfind(", ".join(combo))
            if i > at:
                found, at = ", ".join(combo), i
    if not found:
        return 0.0
    gt = ground_truth.lower()
    words = re.findall(r"[a-z]+", found.lower())
    three = sum(w in ("yes", "no", "unknown") for w in words) == 3
    return float(found == gt or (three and gt in found.lower()))


def zebra_puzzle(ground_truth: str, answer: str, release_date: str) -> float:
    """Zebra puzzles. From ZEBRA_V2_RELEASE: a comma list in <solution> (else \\boxed{},
    else a last line with the right number of commas), scored (all right + fraction
    right) / 2; before: the last ***bold*** word (else the last word) is the answer."""
    if release_date < ZEBRA_V2_RELEASE:
        bold = re.findall(r"\*\*\*(\w+)\*\*\*", answer)
        words = re.findall(r"\b\w+\b", answer)
        last = bold[-1] if bold else (words[-1] if words else "")
        gt = ground_truth.lower()
        return float(
            last.lower() in (gt, gt.removesuffix(" movies")) or WORD_TO_NUMBER.get(gt) == last
        )
    gt = ground_truth.split(",")
    found = _SOLUTION.findall(answer) or _SOLUTION_BROKEN.findall(answer)
    if not found:
        boxed = _boxed(answer)
        if boxed is not None:
            found = [boxed.replace("\\text{", "").replace("}", "").replace("\\", "")]
    if not found:
        last_line = answer.strip().split("\n")[-1]
        found = [last_line] if last_line.count(",") == len(gt) - 1 else []
    if not found:
        return 0.0
    items = (
        [w for f in found for w in f.split(",")][-len(gt) :]
        if len(found) > 1
        else found[-1].split(",")
    )
    right = 0
    for want, got in zip(gt, items, strict=False):
        want = want.strip().lower().replace("-", " ")
        got = got.strip().lower().replace("-", " ").replace("position", "")
        right += want == got or want in got
    return ((right == len(gt)) + right / len(gt)) / 2


def spatial(ground_truth: str, answer: str) -> float:
    """Spatial: one of the last three **bold** phrases is the answer (or its number word;
    "two tetrahedra" counts for "tetrahedra", not "circle square triangle" for "triangle")."""
    gt = ground_truth.strip().lower()
    for word in [b.strip().lower() for b in re.findall(r"\*\*([^\*]+)\*\*", answer)[-3:]]:
        if word == gt or WORD_TO_NUMBER.get(word) == gt:
            return 1.0
        for shape in ("tetrahedra", "tetrahedron", "triangle", "square"):
            if gt == shape and shape in word and len(word) < 2 * len(shape) + 5:
                return 1.0
    return 0.0


def _bold_spans(text: str) -> list[str]:
    """Texts between a run of >= 2 asterisks and the next run at least as long: what
    LiveBench's regex (\\*{2,})(.*?)\\1 finds, in one linear pass (that regex backtracks
    cubically on long runs of asterisks)."""
    parts = re.split(r"(\*{2,})", text)  # text, run, text, run, ...
    spans, open_len, inside = [], 0, []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            inside.append(part)
        elif open_len and len(part) >= open_len:
            spans.append("".join(inside))
            open_len, inside = 0, []
        elif open_len:
            inside.append(part)
        else:
            open_len, inside = len(part), []
    return spans


def house_traversal(ground_truth: str, answer: str) -> float:
    """House traversal: the names, in order, in the last bold phrases or in the last one."""
    bold = _bold_spans(answer.lower())
    if not bold:
        return 0.0
    names = ground_truth.lower().split(" ")
    if len(bold) >= len(names) and all(n in bold[-1 - i] for i, n in enumerate(names[::-1])):
        return 1.0
    at = -1
    for name in names:
        i = bold[-1].find(name)
        if i <= at:
            return 0.0
        at = i
    return 1.0


def _scorer(row: dict) -> Callable[[str], float] | None:
    name = row.get("subtask") or row["task"]
    gt, q = row["ground_truth"], row["question"]
    head = name.split("_")
    if head[0] in ("amc", "smc") or (len(head) > 1 and head[1] == "amc"):
        if not (isinstance(gt, str) and len(gt) == 1 and "A" <= gt <= "E"):
            raise ValueError(
                f"{row.get('id')}: AMC ground_truth must be one letter A-E; got {gt!r}."
            )
        return lambda a: math_contest(gt, a, q)
    if head[0] == "aime":
        return lambda a: aime(gt, a)
    if "amps_hard" in name.lower():
        return lambda a: amps_hard(gt, a)
    if name in ("web_of_lies_v2", "web_of_lies_v3"):
        return lambda a: web_of_lies(gt, a)
    if name == "zebra_puzzle":
        return lambda a: zebra_puzzle(gt, a, row["release_date"])
    if name == "spatial":
        return lambda a: spatial(gt, a)
    if name == "house_traversal":
        return lambda a: house_traversal(gt, a)
    return None


def is_scorable(row: dict) -> bool:
    """Whether kjax scores this question offline (a math or reasoning task listed above)."""
    return _scorer(row) is not None


def score(row: dict, answer: object) -> float:
    """The LiveBench score in [0, 1] of a model answer to one question row.

    row: a decoded `kjax.data.livebench` example ({"task", "subtask", "question",
    "ground_truth", "release_date", ...}). answer: the model's text; <think>...</think>
    is dropped, as LiveBench does. Anything that is not an answer scores 0.
    """
    scorer = _scorer(row)
    if scorer is None:
        raise ValueError(
            f"LiveBench task {row.get('subtask') or row['task']!r} has no offline scorer in "
            "kjax (math: amc/smc/aime/AMPS_Hard; reasoning: web_of_lies_v2/v3, zebra_puzzle, "
            "spatial, house_traversal); filter rows with is_scorable()."
        )
    if not isinstance(answer, str):
        return 0.0
    answer = _THINK.sub("", answer[-_MAX_CHARS:])
    try:
        return float(scorer(answer))
    except Exception:  # noqa: BLE001 - the row was validated above: only the answer is bad
        return 0.0
