"""Benchmark: where one RL step's time goes (sample, verify, advantages, update), and the
update's tokens/s and MFU.

  python -m experiments.bench.bench_rl_step [--shapes=tiny_arith,smollm2] [--steps=5] [--out=F.json]
      [--smoke]

tiny_arith: the real pipeline of experiments/configs/tiny_arith.py:passk (random init, no
SFT). smollm2: random weights of SmolLM2-135M's shape, B x N = 4 x 4 prompts of 64 tokens,
T = 32, the arithmetic verifier on whatever it writes (throughput does not depend on the
weights). FLOPs of the update come from XLA's cost analysis of the compiled step; MFU
divides by --peak_tflops (default: a table of known accelerators, else this machine's
measured float32 matmul rate). A benchmark, not a test: on a shared CPU figures are noisy.

--paths (default tiny_arith,smollm2; empty to skip) also times the update's loss+grad
alone, a PG loss on kjax.rl.forward.completion_logprobs, for the reference path (prompt
repeated N times, logits at every position: shared_prompt=False) and the new one (prompt
once, completion-only chunked log-probs), interleaved in one run, with each compiled
computation's peak temporary memory (XLA memory_analysis). smollm2 here: the SmolLM2-135M
shape (V=49152, 30 layers), B=2 prompts of S=128 tokens, N=8, T=64.
Measured so (2026-12-01, quiet 2-core machine, one run, `--shapes= --paths=smollm2`): at
a7a7897 (named residuals) smollm2 reference 33.09 s vs shared 13.51 s (2.45x), peak
temporaries 3,808 vs 1,241 MiB; before it (cb4ed09) 31.48 vs 13.80 s (2.28x), 7,691 vs
3,215 MiB, tiny_arith 2.11x. The paths' matmul FLOPs differ by 2.51x (2,601 vs 1,037
GFLOP), so on a compute-bound CPU that is the ceiling at this shape (both run at 68-70% MFU):
the 3x goal needs fewer FLOPs than the shared path's, not a faster kernel.
--pack (default tiny_arith,tiny_countdown; empty to skip) times the run's whole update
padded vs packed (rl.pack OFF vs GROUP) on real rollout batches at --pack_T tokens,
alternating, with each batch's padding fraction (experiments.bench.pack_update).
--smoke (seconds; the default test tier runs it so the benchmark cannot rot): tiny_arith,
one warm-up and one timed step, the tiny_arith paths once each, one small packed batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import pack_update, update_paths
from experiments.configs import tiny_arith
from experiments.lab.provenance import cpu_model, matmul_peak
from kjax.rl import api
from kjax.rl.config import ArithConfig, ModelConfig, Objective, ObjectiveConfig, SFTConfig

_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "TPU v5p": 459.0, "TPU v4": 275.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments.bench.bench_rl_step", description=__doc__.split("\n")[0]
    )
    p.add_argument("--shapes", default="tiny_arith", help="tiny_arith and/or smollm2")
    p.add_argument("--steps", type=int, default=5, help="timed RL steps per shape")
    p.add_argument("--warmup", type=int, default=2, help="untimed RL steps before them")
    p.add_argument("--peak_tflops", type=float, default=0.0, help="0: known table / measured")
    p.add_argument("--out", default="", help="also write the results as JSON here")
    p.add_argument("--paths", default="tiny_arith,smollm2", help="update-path shapes ('' skips)")
    p.add_argument("--path_repeats", type=int, default=3, help="timed loss+grad calls (best)")
    p.add_argument("--path_dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument(
        "--pack",
        default=None,
        help="padded vs packed ('' skips; default tiny_arith,tiny_countdown, smoke tiny_arith)",
    )
    p.add_argument("--pack_T", type=int, default=128, help="completion cap of the --pack runs")
    p.add_argument("--pack_batches", type=int, default=2, help="rollout batches per --pack shape")
    p.add_argument("--smoke", action="store_true", help="tiny_arith only, one step: seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.shapes, args.paths, args.steps, args.warmup, args.path_repeats = (
            "tiny_arith", "tiny_arith", 1, 1, 1
        )  # fmt: skip
        args.pack_T, args.pack_batches = 16, 1
        args.pack = "tiny_arith" if args.pack is None else args.pack
    elif args.pack is None:
        args.pack = "tiny_arith,tiny_countdown"
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.paths = [s for s in args.paths.split(",") if s]
    args.pack = [s for s in args.pack.split(",") if s]
    return args


def peak_tflops(flag: float = 0.0, n: int = 2048) -> tuple[float, str]:
    """(peak TFLOP/s, where it came from): the flag, a known accelerator's datasheet, or
    this machine's float32 n x n matmul rate."""
    if flag:
        return flag, "flag"
    kind = jax.devices()[0].device_kind
    for name, tflops in _PEAK_TFLOPS.items():
        if name.lower() in kind.lower():
            return tflops * jax.device_count(), f"table ({kind}, bf16 dense)"
    return matmul_peak(n) / 1e12, f"measured f32 matmul ({kind})"


def config(shape: str, workdir: str, smoke: bool = False):
    cfg = tiny_arith.get_config("passk")
    cfg = dataclasses.replace(cfg, sft=SFTConfig(steps=0), steps=10, name=f"bench_{shape}")
    if smoke:  # fewer samples and problems: the pipeline's code paths, quickly
        cfg = dataclasses.replace(
            cfg, batch_prompts=8, samples=4, objective=ObjectiveConfig(Objective.MAX_AT_K, k=2),
            task=dataclasses.replace(cfg.task, train_size=64, test_size=8),
        )  # fmt: skip
    if shape == "smollm2":
        cfg = dataclasses.replace(
            cfg, batch_prompts=4, samples=4, max_new_tokens=32,
            objective=ObjectiveConfig(Objective.MAX_AT_K, k=4),
            model=ModelConfig(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                              intermediate_size=1536),
            task=ArithConfig(max_prompt_tokens=64),
        )  # fmt: skip
    return cfg


def bench(shape: str, args: argparse.Namespace, peak: tuple[float, str]) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        cfg = config(shape, workdir, args.smoke)
        run = api.open_run(cfg, workdir)
        if shape == "smollm2":  # the real vocabulary size: random-token prompts, same shapes
            run = _widen_vocab(run, 49152)
        state, rows = api.rl_steps(run, run.state, args.warmup + args.steps)
        run.close()
        timed = rows[args.warmup :]
        mean = {n: float(np.mean([r[f"time/{n}"] for r in timed]))
                for n in ("sample", "verify", "advantages", "update", "step")}  # fmt: skip
        flops = _update_flops(run, state)
        tokens = cfg.batch_prompts * cfg.samples * (run.task.prompt_len + cfg.max_new_tokens)
        peak, source = peak
        achieved = flops / mean["update"] / 1e12
        return {
            "shape": shape, "B": cfg.batch_prompts, "N": cfg.samples,
            "S": run.task.prompt_len, "T": cfg.max_new_tokens,
            "params": int(sum(x.size for x in jax.tree.leaves(state.params))),
            "seconds": mean, "update_tokens_per_s": tokens / mean["update"],
            "update_tflops": flops / 1e12, "achieved_tflops_per_s": achieved,
            "peak_tflops_per_s": peak, "peak_source": source, "mfu": achieved / peak,
            "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        }  # fmt: skip


def _widen_vocab(run: api.Run, vocab: int) -> api.Run:
    """Re-initialises the bench model with a real-size vocabulary (the char tokenizer only
    uses its first ids, which keeps verification meaningful and shapes realistic)."""
    from flax import nnx

    from kjax import sharding
    from kjax.models import Llama

    config = dataclasses.replace(run.model_config, vocab_size=vocab)
    make = lambda: Llama(config, rngs=nnx.Rngs(params=jax.random.key(0)))  # noqa: E731
    return api.with_model(run, config, sharding.create_sharded(make, run.mesh).params())


def _update_flops(run: api.Run, state) -> float:
    """FLOPs of one update (XLA's cost analysis of the compiled step at the run's shape)."""
    cost = api.lower_update(run, state).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0))


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = jnp.dtype(args.path_dtype)
    peak = peak_tflops(args.peak_tflops, 256 if args.smoke else 2048)
    paths = [update_paths.compare(s, args.path_repeats, dtype, peak[0]) for s in args.paths]
    if paths:
        print(update_paths.table(paths) + "\n", flush=True)
    packs = [
        pack_update.compare(s, args.pack_T, args.pack_batches, args.path_repeats, args.smoke)
        for s in args.pack
    ]
    if packs:
        print(pack_update.table(packs), flush=True)
        print(f"CPU: {cpu_model()}; peak {peak[0]:.3f} TFLOP/s ({peak[1]})\n", flush=True)
    results = [bench(shape, args, peak) for shape in args.shapes]
    if results:
        print("| shape | params | B x N x (S+T) | sample s | verify s | advantages s | "
              "update s | update tokens/s | MFU |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["seconds"]
        shape = f"{r['B']}x{r['N']}x{r['S'] + r['T']}"
        print(f"| {r['shape']} | {r['params']:,} | {shape} | {s['sample']:.4f} | "
              f"{s['verify']:.4f} | {s['advantages']:.4f} | {s['update']:.4f} | "
              f"{r['update_tokens_per_s']:,.0f} | {r['mfu']:.2%} |")  # fmt: skip
    if results:
        r = results[0]
        print(f"\npeak: {r['peak_tflops_per_s']:.2f} TFLOP/s ({r['peak_source']})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"steps": results, "update_paths": paths, "pack": packs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
