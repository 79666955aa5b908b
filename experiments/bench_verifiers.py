"""Verifier throughput with the process pool (not a timed test).

    python -m experiments.bench_verifiers [--workers 2]

Math: 1,000 completions (100 prompts x 10); code: 200 programs x 5 stdin/stdout tests,
each test a separate bubblewrap run. Prints a Markdown table of completions per second.
"""

from __future__ import annotations

import argparse
import time

from kjax.rewards import code
from kjax.rewards import math as math_rewards
from kjax.rewards.pool import PoolConfig, VerifierPool


def math_batch(prompts: int = 100, samples: int = 10) -> tuple[list[list[str]], list[str]]:
    """Mixed answer forms: boxed fractions, decimals, "the answer is", wrong, none."""
    completions, references = [], []
    for i in range(prompts):
        a, b = i + 1, i + 2
        forms = [
            f"\\boxed{{\\frac{{{a}}}{{{b}}}}}",
            f"The answer is {a / b:.6f}",
            f"so we get \\boxed{{{a}/{b}}}.",
            f"\\boxed{{{a + 1}}}",
            "I am not sure.",
            f"Therefore x = \\boxed{{\\frac{{{2 * a}}}{{{2 * b}}}}}",
            f"{a} {b} {a * b}",
            f"The answer is $\\frac{{{a}}}{{{b}}}$.",
            f"\\boxed{{{b}/{a}}}",
            "\\boxed{x^2}",
        ]
        completions.append(forms[:samples])
        references.append(f"\\frac{{{a}}}{{{b}}}")
    return completions, references


def code_batch(prompts: int = 40, samples: int = 5, tests: int = 5):
    """Sum-of-integers problems; programs correct, off by one, crashing, or slow-ish."""
    programs = [
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
        "```python\nnums = list(map(int, input().split()))\nprint(sum(nums))\n```",
        "print(sum(map(int, input().split())) + 1)",
        "raise RuntimeError('boom')",
        "s = 0\nfor t in input().split():\n    s += int(t)\nprint(s)",
    ][:samples]
    cases = [(" ".join(str(j) for j in range(k + 2)), str(sum(range(k + 2)))) for k in range(tests)]
    return [programs] * prompts, [cases] * prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with VerifierPool(PoolConfig(workers=args.workers, item_timeout_s=60)) as pool:
        pool.map(math_rewards.extract, ["\\boxed{1}"] * args.workers, default=None)  # warm up
        completions, refs = math_batch()
        start = time.perf_counter()
        v = math_rewards.verify(completions, refs, pool=pool)
        elapsed = time.perf_counter() - start
        n = v.scores.size
        rows.append(("math (math-verify)", n, elapsed, float(v.scores.mean())))
        programs, tests = code_batch()
        start = time.perf_counter()
        v = code.verify(programs, tests, timeout_s=5.0, pool=pool)
        elapsed = time.perf_counter() - start
        rows.append(("code (bwrap, 5 tests each)", v.scores.size, elapsed, float(v.scores.mean())))
    print(f"workers: {args.workers}\n")
    print("| verifier | completions | seconds | completions/s | mean score |")
    print("|---|---:|---:|---:|---:|")
    for name, count, seconds, mean in rows:
        print(f"| {name} | {count} | {seconds:.1f} | {count / seconds:.1f} | {mean:.3f} |")


if __name__ == "__main__":
    main()
