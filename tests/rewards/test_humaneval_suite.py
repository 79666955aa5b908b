"""The HumanEval harness on the real 164 problems: every canonical solution passes every
assert unit, and a stub body (returns None) does not pass them all. The default tier checks
every 4th problem (41, ~20 s); `pytest -m slow` all 164."""

import gzip
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from kjax.data.builders import humaneval_file
from kjax.rewards import humaneval
from tests.rewards.sandbox_env import require_bwrap


@pytest.fixture(scope="module")
def problems():
    require_bwrap()
    with gzip.open(humaneval_file(), "rt") as f:
        return [json.loads(line) for line in f]


def _scores(problems, body):
    def run(p):
        return humaneval.score(p["prompt"] + body(p), p["test"], p["entry_point"], timeout_s=10)

    with ThreadPoolExecutor(2) as pool:  # each run is its own sandboxed process
        return list(pool.map(run, problems))


@pytest.mark.parametrize("stride", [4, pytest.param(1, marks=pytest.mark.slow)])
def test_canonical_solutions_pass_every_unit(problems, stride):
    assert len(problems) == 164
    chosen = problems[::stride]
    scores = _scores(chosen, lambda p: p["canonical_solution"])
    assert [p["task_id"] for p, s in zip(chosen, scores, strict=True) if s != 1.0] == []


def test_stub_bodies_fail(problems):
    scores = _scores(problems[::8], lambda p: "    return None\n")
    assert all(s < 1.0 for s in scores)


def test_assemble_program_accepts_a_body_or_a_full_function():
    prompt = 'from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    """Sum."""\n'
    ns_body, ns_full = {}, {}
    exec(humaneval.assemble_program(prompt, "f", "    return sum(xs)\n"), ns_body)  # trusted
    full = "```python\ndef f(xs: List[int]) -> int:\n    return sum(xs)\n```"
    exec(humaneval.assemble_program(prompt, "f", full), ns_full)
    assert ns_body["f"]([1, 2]) == ns_full["f"]([1, 2]) == 3


def test_verify_batch_scores_and_unit_classes():
    require_bwrap()
    problem = humaneval.Problem(
        prompt="def inc(x):\n",
        test="def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n",
        entry_point="inc",
    )
    completions = [
        "    return x + 1\n",  # passes both: class 0
        "```python\ndef inc(x):\n    return 1 + x\n```",  # same units passed: class 0
        "    return 2 if x == 1 else 0\n",  # first unit only
        "    return 0\n",  # none passed, but it reported: a class of its own
        "    import os\n    os._exit(0)\n",  # the harness never reports: no answer
    ]
    v = humaneval.verify([completions], [problem], timeout_s=2.0)
    assert v.scores.tolist() == [[1.0, 1.0, 0.5, 0.0, 0.0]]
    assert v.answer_ids.tolist() == [[0, 0, 1, 2, -1]]
