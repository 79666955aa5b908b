"""Verifier throughput with the process pool (not a timed test).

    python -m experiments.bench.bench_verifiers [--workers 2] [--smoke] [--out F.json]

Math: 1,000 completions (100 prompts x 10); code: 200 programs x 5 stdin/stdout tests,
each test a separate bubblewrap run. Prints a Markdown table of completions per second.
Without bubblewrap the code row is skipped, with the reason printed. --smoke (what the
default test tier runs, so the benchmark cannot rot): 4 x 10 math, 2 x 5 programs x 1 test.
"""

from __future__ import annotations

import argparse
import json
import time

from kjax.rewards import code
from kjax.rewards import math as math_rewards
from kjax.rewards.pool import PoolConfig, VerifierPool
from kjax.rewards.sandbox import DEFAULT_SANDBOX, SandboxUnavailableError, check_available


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few items of each: seconds")
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    math_shape, code_shape = ((4, 10), (2, 5, 1)) if args.smoke else ((100, 10), (40, 5, 5))
    try:
        check_available(DEFAULT_SANDBOX)
        skipped = None
    except SandboxUnavailableError as e:
        skipped = str(e)
    rows = []
    with VerifierPool(PoolConfig(workers=args.workers, item_timeout_s=60)) as pool:
        pool.map(math_rewards.extract, ["\\boxed{1}"] * args.workers, default=None)  # warm up
        completions, refs = math_batch(*math_shape)
        start = time.perf_counter()
        v = math_rewards.verify(completions, refs, pool=pool)
        elapsed = time.perf_counter() - start
        n = v.scores.size
        rows.append(("math (math-verify)", n, elapsed, float(v.scores.mean())))
        if skipped is None:
            programs, tests = code_batch(*code_shape)
            start = time.perf_counter()
            v = code.verify(programs, tests, timeout_s=5.0, pool=pool)
            elapsed = time.perf_counter() - start
            name = f"code (bwrap, {code_shape[2]} tests each)"
            rows.append((name, v.scores.size, elapsed, float(v.scores.mean())))
    print(f"workers: {args.workers}\n")
    print("| verifier | completions | seconds | completions/s | mean score |")
    print("|---|---:|---:|---:|---:|")
    for name, count, seconds, mean in rows:
        print(f"| {name} | {count} | {seconds:.1f} | {count / seconds:.1f} | {mean:.3f} |")
    if skipped is not None:
        print(f"\ncode row skipped: {skipped}")
    if args.out:
        keys = ("verifier", "completions", "seconds", "mean_score")
        with open(args.out, "w") as f:
            json.dump(
                {"rows": [dict(zip(keys, r, strict=True)) for r in rows], "code_skipped": skipped},
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
