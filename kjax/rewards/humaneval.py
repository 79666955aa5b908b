"""HumanEval-style checks (a function plus `def check(candidate)` with asserts), run in the
code sandbox with per-assert partial credit.

Each assert-bearing statement of `check` is one unit; `==`/`!=` in asserts compare plain
data only, so a candidate returning an object whose __eq__ is always True fails. The
harness shares a process with the candidate, so a program that introspects the harness
could still forge its result line: the sandbox bounds the damage, not the honesty.
"""

from __future__ import annotations

import ast
import dataclasses
import secrets
from collections.abc import Sequence

from kjax.rewards.code import extract_program
from kjax.rewards.pool import VerifierPool
from kjax.rewards.sandbox import (
    DEFAULT_SANDBOX,
    SandboxConfig,
    Status,
    check_available,
    run_python,
)
from kjax.rewards.verdict import AnswerClasses, PromptVerdict, Verdicts, stack

# Trusted harness; runs inside the sandbox. It keeps os.write and the nonce (read from
# stdin) in locals of _main, out of the module globals a candidate can import, and
# reports on one nonce-tagged line.
_HARNESS = """\
def _main():
    import os, sys
    write, nonce = os.write, sys.stdin.readline().strip()
    plain_types = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict,
                   set, frozenset)
    def plain(x, depth=0):
        if depth > 50 or type(x) not in plain_types:
            return False
        if type(x) in (list, tuple, set, frozenset):
            return all(plain(v, depth + 1) for v in x)
        if type(x) is dict:
            return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
        return True
    def strict_eq(a, b):
        if not (plain(a) and plain(b)):
            raise AssertionError("compared a non-plain object")
        return a == b
    passed = []
    ns = {"__name__": "candidate"}
    try:
        exec(compile(PROGRAM, "candidate.py", "exec"), ns)
        ns["_kjax_eq"], ns["_kjax_passed"] = strict_eq, passed
        exec(compile(TEST, "test.py", "exec"), ns)
        ns["check"](ns[ENTRY])
    except BaseException:
        pass
    write(1, ("\\n%s %s\\n" % (nonce, ",".join(str(i) for i in sorted(set(passed))))).encode())
_main()
"""


@dataclasses.dataclass(frozen=True)
class HumanEvalResult:
    passed: tuple[bool, ...]  # one per assert unit of `check`
    reported: bool  # False: the harness never reported (timeout, crash, early exit)

    @property
    def score(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


class _StrictEq(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], ast.Eq | ast.NotEq):
            return node
        call = ast.Call(ast.Name("_kjax_eq", ast.Load()), [node.left, node.comparators[0]], [])
        return call if isinstance(node.ops[0], ast.Eq) else ast.UnaryOp(ast.Not(), call)


def instrument(test: str) -> tuple[str, int]:
    """Rewrites `check`'s body so each assert-bearing statement records its own success.

    Returns (new test source, number of units). Raises ValueError if there is no check.
    """
    tree = ast.parse(test)
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None:
        raise ValueError("HumanEval test code must define `def check(candidate): ...`.")
    body, units = [], 0
    for stmt in check.body:
        if not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            body.append(stmt)  # setup; if it raises, the remaining units count as failed
            continue
        record = ast.parse(f"_kjax_passed.append({units})").body
        body.append(
            ast.Try(
                body=[_StrictEq().visit(stmt)],
                handlers=[
                    ast.ExceptHandler(ast.Name("BaseException", ast.Load()), None, [ast.Pass()])
                ],
                orelse=record,
                finalbody=[],
            )
        )
        units += 1
    check.body = body or [ast.Pass()]
    return ast.unparse(ast.fix_missing_locations(tree)), units


def check_program(
    program: str,
    test: str,
    entry_point: str,
    *,
    timeout_s: float,
    config: SandboxConfig = DEFAULT_SANDBOX,
) -> HumanEvalResult:
    """Runs `program` (which defines `entry_point`) against `test`'s check() in the sandbox.

    A timeout, crash or missing result line fails every unit.
    """
    instrumented, units = instrument(test)
    nonce = secrets.token_hex(16)
    source = f"PROGRAM = {program!r}\nTEST = {instrumented!r}\nENTRY = {entry_point!r}\n" + _HARNESS
    result = run_python(source, (nonce + "\n").encode(), timeout_s, config)
    passed: set[int] = set()
    reported = False
    if result.status is Status.OK:
        lines = [
            ln for ln in result.stdout.decode(errors="replace").splitlines() if ln.startswith(nonce)
        ]
        if len(lines) == 1:  # the harness prints it exactly once, last
            fields = lines[0][len(nonce) :].strip()
            passed = {int(v) for v in fields.split(",") if v.isdigit()}
            reported = True
    return HumanEvalResult(tuple(i in passed for i in range(units)), reported)


def score(
    program: str,
    test: str,
    entry_point: str,
    *,
    timeout_s: float,
    config: SandboxConfig = DEFAULT_SANDBOX,
) -> float:
    """Fraction of check()'s assert units passed, in [0, 1]."""
    return check_program(program, test, entry_point, timeout_s=timeout_s, config=config).score


def assemble_program(prompt: str, entry_point: str, completion: str) -> str:
    """The program to test: the prompt (imports, helpers, signature, docstring) followed by
    the completion's code, which is either the function's body or a full redefinition."""
    code = extract_program(completion)
    if f"def {entry_point}" in code:
        return prompt + "\n    pass\n\n" + code
    return prompt + code


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt: str
    test: str  # defines check(candidate)
    entry_point: str


@dataclasses.dataclass(frozen=True)
class _Check:
    program: str
    problem: Problem
    timeout_s: float
    config: SandboxConfig


def _check(item: _Check) -> HumanEvalResult:
    p = item.problem
    return check_program(
        item.program, p.test, p.entry_point, timeout_s=item.timeout_s, config=item.config
    )


def verify(
    completions: Sequence[Sequence[str]],
    problems: Sequence[Problem],
    *,
    timeout_s: float,
    config: SandboxConfig = DEFAULT_SANDBOX,
    pool: VerifierPool | None = None,
) -> Verdicts:
    """completions: [B][N]; problems: [B]. Scores [B, N] = fraction of assert units passed.

    Answer classes: programs passing the same set of units share a class; class 0 passes
    them all; a program whose harness never reported has no answer (-1). counts tallies
    the programs by outcome (see _outcome).
    """
    if len(completions) != len(problems):
        raise ValueError(
            f"humaneval.verify: {len(completions)} prompts but {len(problems)} "
            "problems; pass one Problem per prompt."
        )
    check_available(config)
    items = [
        _Check(assemble_program(p.prompt, p.entry_point, c), p, timeout_s, config)
        for cs, p in zip(completions, problems, strict=True)
        for c in cs
    ]
    results = iter(pool.map(_check, items, default=None) if pool else map(_check, items))
    rows, counts = [], dict.fromkeys(("all_passed", "some_failed", "unreported", "lost"), 0)
    for cs, p in zip(completions, problems, strict=True):
        units = instrument(p.test)[1]
        classes = AnswerClasses((True,) * units, equivalent=lambda a, b: a == b, key=lambda a: a)
        got = [next(results) for _ in cs]
        for r in got:
            counts[_outcome(r)] += 1
        rows.append(PromptVerdict(
            scores=[r.score if r is not None else 0.0 for r in got],
            answer_ids=[classes.id_of(r.passed if r is not None and r.reported else None)
                        for r in got],
        ))  # fmt: skip
    return stack(rows, counts)


def _outcome(result: HumanEvalResult | None) -> str:
    """A program's outcome for the step metrics: "unreported" is a crash, a timeout or a
    program that exited before check() finished; "lost" a pool item that never returned."""
    if result is None:
        return "lost"
    if not result.reported:
        return "unreported"
    return "all_passed" if all(result.passed) else "some_failed"
