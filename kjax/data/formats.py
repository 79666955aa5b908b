"""Row parsers for the public JSONL formats of MATH, GSM8K, HARP, CodeContests and TACO.

Each parser maps one JSON object to kjax's schema or raises RowError; read_jsonl adds the
file name and line number, so a malformed row fails preparation with both.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kjax.rewards.extract import last_boxed


class MathFormat(enum.Enum):
    MATH = "math"  # Hendrycks MATH: problem, solution (answer = last \boxed{}), level, type
    GSM8K = "gsm8k"  # question, answer ("... #### 72")
    HARP = "harp"  # problem, answer (+ year, contest, number, level, subject)


class CodeFormat(enum.Enum):
    CODE_CONTESTS = "code_contests"  # name, description, public/private/generated_tests
    TACO = "taco"  # question, input_output (a JSON string: {"inputs", "outputs"})


class RowError(ValueError):
    pass


def _field(row: dict, name: str, kind: type | tuple[type, ...] = str) -> Any:
    if name not in row:
        raise RowError(f"missing field {name!r} (has {sorted(row)})")
    if not isinstance(row[name], kind) or isinstance(row[name], bool):
        kinds = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise RowError(f"field {name!r} must be {kinds}, got {type(row[name]).__name__}")
    return row[name]


def parse_math(row: dict, fmt: MathFormat, index: int) -> dict:
    """-> {"id", "problem", "answer", "source"}; the answer is a string for math-verify."""
    if fmt is MathFormat.MATH:
        problem, solution = _field(row, "problem"), _field(row, "solution")
        answer = last_boxed(solution)
        if answer is None:
            raise RowError("MATH solution has no \\boxed{...} answer")
    elif fmt is MathFormat.GSM8K:
        problem, solution = _field(row, "question"), _field(row, "answer")
        if "####" not in solution:
            raise RowError("GSM8K answer has no '#### <number>' line")
        answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    else:
        problem, answer = _field(row, "problem"), str(_field(row, "answer", (str, int, float)))
    if not problem.strip() or not answer.strip():
        raise RowError("empty problem or answer")
    if fmt is MathFormat.HARP and all(k in row for k in ("year", "contest", "number")):
        uid = f"harp-{row['year']}-{row['contest']}-{row['number']}"
    else:
        uid = str(row.get("unique_id") or row.get("id") or f"{fmt.value}-{index}")
    return {"id": uid, "problem": problem, "answer": answer, "source": fmt.value}


def _tests(inputs: Any, outputs: Any) -> list[tuple[str, str]]:
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise RowError("test inputs and outputs must be lists")
    if len(inputs) != len(outputs):
        raise RowError(f"{len(inputs)} test inputs but {len(outputs)} outputs")
    if not all(isinstance(v, str) for v in inputs + outputs):
        raise RowError("test inputs and outputs must be strings")
    return list(zip(inputs, outputs, strict=True))


def parse_code(row: dict, fmt: CodeFormat, index: int) -> dict | None:
    """-> {"id", "problem", "inputs", "outputs", "source"}, or None for a problem with no
    stdin/stdout test (e.g. TACO's call-based problems), which kjax cannot judge."""
    if fmt is CodeFormat.CODE_CONTESTS:
        problem, uid = _field(row, "description"), str(row.get("name") or f"cc-{index}")
        tests = []
        for group in ("public_tests", "private_tests", "generated_tests"):
            t = row.get(group) or {"input": [], "output": []}
            if not isinstance(t, dict):
                raise RowError(f"field {group!r} must be an object with input/output lists")
            tests += _tests(t.get("input", []), t.get("output", []))
    else:
        problem, uid = _field(row, "question"), f"taco-{index}"
        raw = row.get("input_output") or "{}"
        try:
            io = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as e:
            raise RowError(f"input_output is not valid JSON: {e}") from None
        if not isinstance(io, dict):
            raise RowError("input_output must be a JSON object")
        if io.get("fn_name"):
            return None
        tests = _tests(io.get("inputs", []), io.get("outputs", []))
    if not tests:
        return None
    return {
        "id": uid,
        "problem": problem,
        "inputs": [i for i, _ in tests],
        "outputs": [o for _, o in tests],
        "source": fmt.value,
    }


def read_jsonl(path: Path, parse: Callable[[dict, int], dict | None]) -> Iterator[dict]:
    """Yields parsed rows; raises ValueError naming the file and 1-based line on a bad row."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise RowError("a row must be a JSON object")
                parsed = parse(row, line_no)
            except (json.JSONDecodeError, RowError) as e:
                raise ValueError(
                    f"{path}:{line_no}: malformed row: {e}. Fix or remove this "
                    "line and prepare again."
                ) from None
            if parsed is not None:
                yield parsed
