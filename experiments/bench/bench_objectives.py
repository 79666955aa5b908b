"""Benchmark: time per call of every objective, jitted and warmed up, next to its oracle.

  python -m experiments.bench.bench_objectives [--batch=1024 --group=64 --k=8 --json=FILE] [--smoke]

Prints a Markdown table: the fast estimator at B x N (default 1024 x 64), and both the
fast estimator and its subset-enumeration oracle (reference.py) on small groups (N = 10,
k = 4), where enumeration is still feasible. A benchmark, not a test: it prints figures.
--smoke (what the default test tier runs, so an API change cannot rot it): B x N = 8 x 10,
k = 4, the small-group shape, so each function compiles once; 2 calls per figure.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from kjax import objectives as obj
from kjax.objectives import reference as ref
from kjax.objectives import reference_offpolicy as ref_off

E, M = obj.MaxAtKEstimator, obj.MeanBaseline

SMOKE = {"batch": 8, "group": 10, "k": 4, "repeats": 2}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments.bench.bench_objectives", description=__doc__.split("\n")[0]
    )
    p.add_argument("--batch", type=int, default=1024, help="B: prompts per call")
    p.add_argument("--group", type=int, default=64, help="N: samples per prompt")
    p.add_argument("--k", type=int, default=8, help="k of the k-sample objectives")
    p.add_argument("--repeats", type=int, default=20, help="timed calls (the median is reported)")
    p.add_argument("--json", default=None, help="optional path for the figures as JSON")
    p.add_argument("--smoke", action="store_true", help="8 x 10, k = 4: seconds")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    if not 1 <= args.k <= args.group:
        p.error(f"--k must be in [1, --group={args.group}]; got {args.k}.")
    return args


def inputs(b: int, n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "rewards": jnp.asarray(rng.uniform(size=(b, n)).round(2), jnp.float32),
        "correct": jnp.asarray(rng.random((b, n)) < 0.3),
        "answers": jnp.asarray(rng.integers(-1, 5, size=(b, n)), jnp.int32),
        "target": jnp.asarray(rng.integers(0, 5, size=(b,)), jnp.int32),
        "log_ratio": jnp.asarray(rng.normal(0, 0.05, size=(b, n)), jnp.float32),
    }


MIXTURE = "max_at_k_mixture_advantages[maxrl_weights(2k), LOO_MINUS_ONE]"


def min_group(name: str, k: int) -> int:
    """The smallest N a case accepts (LOO and L2O need N > k; the mixture N >= 2k)."""
    if name == MIXTURE:
        return 2 * k
    needs = {f"max_at_k_advantages[{e.name}]": e.min_samples(k) for e in E}
    return needs.get(name, k)


def cases(k: int) -> dict:
    """name -> (fast fn of inputs dict, oracle fn of numpy inputs dict)."""
    out = {
        "pass_at_k": (
            lambda x: obj.pass_at_k(x["correct"], k),
            lambda x: ref.pass_at_k_ref(x["correct"], k),
        ),
        "max_at_k": (
            lambda x: obj.max_at_k(x["rewards"], k),
            lambda x: ref.max_at_k_ref(x["rewards"], k),
        ),
        "majority_at_k": (
            lambda x: obj.majority_at_k(x["answers"], x["target"], k),
            lambda x: ref.majority_at_k_ref(x["answers"], x["target"], k),
        ),
    }
    for b in M:
        out[f"mean_advantages[{b.name}]"] = (
            lambda x, b=b: obj.mean_advantages(x["rewards"], b),
            lambda x, b=b: ref.mean_advantages_ref(x["rewards"], b),
        )
    for e in E:
        key = "correct_f" if e is E.CHEN_ANALYTIC else "rewards"
        out[f"max_at_k_advantages[{e.name}]"] = (
            lambda x, e=e, key=key: obj.max_at_k_advantages(x[key], k, e),
            lambda x, e=e, key=key: ref.max_at_k_advantages_ref(x[key], k, e),
        )
    out[MIXTURE] = (  # MaxRL with T = 2k: 16 at the default k = 8
        lambda x: obj.max_at_k_mixture_advantages(x["rewards"], obj.maxrl_weights(2 * k)),
        lambda x: ref.max_at_k_mixture_advantages_ref(
            x["rewards"], obj.maxrl_weights(2 * k), E.LOO_MINUS_ONE
        ),
    )
    for centered in (False, True):
        out[f"majority_at_k_advantages[centered={centered}]"] = (
            lambda x, c=centered: obj.majority_at_k_advantages(x["answers"], x["target"], k, c),
            lambda x, c=centered: ref.majority_at_k_advantages_ref(x["answers"], x["target"], k, c),
        )
    for e in (E.S, E.LOO_MINUS_ONE, E.L2O):
        for exact in (True, False):
            out[f"max_at_k_offpolicy_advantages[{e.name},exact={exact}]"] = (
                lambda x, e=e, ex=exact: obj.max_at_k_offpolicy_advantages(
                    x["rewards"], x["log_ratio"], k, estimator=e, exact=ex, clamp=0.2
                ),
                lambda x, e=e, ex=exact: ref_off.max_at_k_offpolicy_advantages_ref(
                    x["rewards"], x["log_ratio"], k, e, ex, 0.2
                ),
            )
    return out


def with_binary(x: dict) -> dict:
    return {**x, "correct_f": x["correct"].astype(jnp.float32)}


def time_jitted(fn, x: dict, repeats: int) -> float:
    """Median seconds per call of jit(fn)(x), after a warm-up call that compiles."""
    f = jax.jit(fn)
    jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def time_oracle(fn, x: dict) -> float:
    x = {key: np.asarray(v) for key, v in x.items()}
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    f = parse_args(argv)
    big = with_binary(inputs(f.batch, f.group))
    small_b, small_n, small_k = 8, 10, 4
    small = with_binary(inputs(small_b, small_n, seed=1))
    rows = []
    big_cases, small_cases = cases(f.k), cases(small_k)
    for name, (fast, _) in big_cases.items():
        if f.group < min_group(name, f.k):
            continue
        small_fast, oracle = small_cases[name]
        t_small = time_jitted(small_fast, small, f.repeats)
        same = (f.batch, f.group, f.k) == (small_b, small_n, small_k)  # --smoke: time it once
        t_big = t_small if same else time_jitted(fast, big, f.repeats)
        t_oracle = time_oracle(oracle, small)
        rows.append(
            {
                "name": name,
                "big_ms": 1e3 * t_big,
                "big_us_per_group": 1e6 * t_big / f.batch,
                "small_us_per_group": 1e6 * t_small / small_b,
                "oracle_us_per_group": 1e6 * t_oracle / small_b,
            }
        )
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; jitted, warmed up, "
        f"median of {f.repeats} calls.\n"
    )
    print(
        f"| function | B={f.batch}, N={f.group}, k={f.k}: ms/call | us/group "
        f"| N={small_n}, k={small_k}: fast us/group | oracle us/group | oracle/fast |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['big_ms']:.2f} | {r['big_us_per_group']:.2f} "
            f"| {r['small_us_per_group']:.1f} | {r['oracle_us_per_group']:.0f} "
            f"| {r['oracle_us_per_group'] / r['small_us_per_group']:.0f}x |"
        )
    if f.json:
        with open(f.json, "w") as fh:
            json.dump({"batch": f.batch, "group": f.group, "k": f.k, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
