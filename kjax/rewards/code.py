"""Code verifier: the fraction of stdin/stdout tests a program passes, each run sandboxed
(see sandbox.py). Any violation (crash, limit, timeout, wrong output) fails that test."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from kjax.rewards.pool import VerifierPool
from kjax.rewards.sandbox import (
    DEFAULT_SANDBOX,
    RunResult,
    SandboxConfig,
    Status,
    check_available,
    run_python,
)
from kjax.rewards.verdict import AnswerClasses, PromptVerdict, Verdicts, stack

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_program(completion: str) -> str:
    """The last fenced code block of a completion, or the whole completion if none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def normalize_output(text: str | bytes) -> tuple[str, ...]:
    """Output compared up to whitespace: runs of spaces/tabs and blank lines don't count."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return tuple(" ".join(line.split()) for line in text.splitlines() if line.strip())


def run_tests(
    program: str,
    tests: Sequence[tuple[str, str]],
    *,
    timeout_s: float,
    config: SandboxConfig = DEFAULT_SANDBOX,
) -> list[tuple[str, ...] | None]:
    """Runs the program once per test input; returns each run's normalized stdout, or
    None where the run failed (non-zero exit, signal, timeout). tests: [(stdin, stdout)]."""
    outputs: list[tuple[str, ...] | None] = []
    for stdin, _ in tests:
        result: RunResult = run_python(program, stdin.encode(), timeout_s, config)
        outputs.append(normalize_output(result.stdout) if result.status is Status.OK else None)
    return outputs


def score(
    program: str,
    tests: Sequence[tuple[str, str]],
    *,
    timeout_s: float,
    config: SandboxConfig = DEFAULT_SANDBOX,
) -> float:
    """Fraction of stdin/stdout tests passed (whitespace normalized), in [0, 1].

    Each test is a separate sandboxed run limited to `timeout_s` seconds. Raises
    SandboxUnavailableError when bwrap is missing, unless `config.isolation` opts out.
    """
    if not tests:
        raise ValueError("code.score needs at least one (stdin, stdout) test.")
    outputs = run_tests(program, tests, timeout_s=timeout_s, config=config)
    passed = sum(
        out == normalize_output(expected) for out, (_, expected) in zip(outputs, tests, strict=True)
    )
    return passed / len(tests)


@dataclasses.dataclass(frozen=True)
class _Run:
    """One pool item: one program on one test input (so the pool's per-item timeout need
    only exceed one run's, however many tests a problem has)."""

    program: str
    stdin: str
    timeout_s: float
    config: SandboxConfig


def _run(item: _Run) -> tuple[str, tuple[str, ...] | None]:
    """(the run's outcome, its normalized stdout or None if it did not exit 0)."""
    result = run_python(item.program, item.stdin.encode(), item.timeout_s, item.config)
    if result.status is Status.OK:
        return "ran", normalize_output(result.stdout)
    return ("timeout" if result.status is Status.TIMEOUT else "crashed"), None


# A pool item that never came back (the worker hung past the pool's own limit, or died).
_LOST = ("lost", None)


def verify(
    completions: Sequence[Sequence[str]],
    tests: Sequence[Sequence[tuple[str, str]]],
    *,
    timeout_s: float,
    config: SandboxConfig = DEFAULT_SANDBOX,
    pool: VerifierPool | None = None,
) -> Verdicts:
    """completions: [B][N] (a fenced code block or bare program); tests: [B] lists of
    (stdin, stdout). Returns scores [B, N] = fraction of tests passed and answer ids.

    Answer classes are behaviours: programs printing the same (normalized) outputs on the
    tests share a class; class 0 is the expected outputs; a program that fails every run
    has no answer (-1). With `pool`, all B*N*tests runs go through it in parallel.

    counts tallies the test runs by outcome: "passed", "wrong" (exited 0, other output),
    "crashed" (non-zero exit or a limit's signal), "timeout", "lost" (the pool gave up).
    """
    if len(completions) != len(tests):
        raise ValueError(f"code.verify: {len(completions)} prompts but {len(tests)} test lists.")
    if any(not t for t in tests):
        raise ValueError("code.verify: every prompt needs at least one (stdin, stdout) test.")
    check_available(config)  # fail here, in the caller, not once per item inside the pool
    items = [
        _Run(extract_program(c), stdin, timeout_s, config)
        for cs, t in zip(completions, tests, strict=True)
        for c in cs
        for stdin, _ in t
    ]
    runs = iter(pool.map(_run, items, default=_LOST) if pool else map(_run, items))
    rows, counts = [], dict.fromkeys(("passed", "wrong", "crashed", "timeout", "lost"), 0)
    for cs, t in zip(completions, tests, strict=True):
        expected = tuple(normalize_output(out) for _, out in t)
        classes = AnswerClasses(expected, equivalent=lambda a, b: a == b, key=lambda a: a)
        scores, ids = [], []
        for _ in cs:
            outcomes, sig = zip(*(next(runs) for _ in t), strict=True)
            hits = [o == e for o, e in zip(sig, expected, strict=True)]
            for outcome, hit in zip(outcomes, hits, strict=True):
                counts["passed" if hit else "wrong" if outcome == "ran" else outcome] += 1
            scores.append(sum(hits) / len(t))
            ids.append(classes.id_of(sig if any(o is not None for o in sig) else None))
        rows.append(PromptVerdict(scores=scores, answer_ids=ids))
    return stack(rows, counts)
