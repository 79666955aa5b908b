"""Benchmark: kjax's grouped sampler vs transformers' `generate` at the SmolLM2-135M shape.

  python -m experiments.bench.bench_sampler [--shapes=8x8,64x1 --prompt_len=64 --new_tokens=64]
      [--model=smollm2|llama3_1b --dtype=float32|bfloat16 --out=F.json]
      [--tunix_python=/tmp/tunixenv/bin/python]  (or $KJAX_TUNIX_PYTHON)  [--smoke]

Random weights of the real shape (throughput does not depend on their values; no stop ids,
so every sample runs all T tokens). Prints Markdown tables: new tokens/s of both at the same
B x N, prefill time for N = 1 vs N = 16, KV-cache bytes, and the fraction of this machine's
measured float32 matmul peak and memory bandwidth. With a Tunix environment's python
(`python3 -m venv /tmp/tunixenv && /tmp/tunixenv/bin/pip install google-tunix`; Tunix and its
pinned jax never enter kjax's env) it also times Tunix's Sampler on its own Llama3 at the
same shapes (experiments/bench/peers/tunix_sampler.py; smollm2, float32; it repeats each
prompt N times).
A benchmark, not a test: it prints figures, and on a shared CPU they are noisy (run it on a
quiet machine to compare). One run with Tunix (2026-12-01, quiet 2-core machine, smollm2,
float32, S = T = 64; matmul peak 117 GFLOP/s): 8 x 8 kjax 164 tok/s, transformers 91, Tunix
86; 64 x 1 kjax 120, transformers 95, Tunix 88. Compile: kjax 35-42 s, Tunix 55-61 s.
--smoke (seconds; the default test tier runs it so the benchmark cannot rot): a 2-layer
d=32 model, 2 x 2, S = 8, T = 4, transformers in this process, Tunix skipped unless given.

  python -m experiments.bench.bench_sampler --compact_floor=4 [--stop_rate=0.02]
      [--shapes=4x8 --new_tokens=128 --repeats=3]

Compaction mode (issue 45): the static decode against the compacting one
(`sample_params(compact_floor=...)`), timed alternately in one process, with stop ids
so that lengths spread: the first round(stop_rate * V) token ids stop a sample, which on
random weights (a near-uniform next-token distribution) ends a sample at each step with
probability about stop_rate, a geometric length capped at T. Prints the lengths (mean,
share at the cap), both decodes' padding fractions (decode row-steps on stopped samples
over all, `sampling.decode_row_steps`), their times and whether the tokens agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from experiments.lab.provenance import matmul_peak
from kjax import sampling
from kjax.models import Llama, Llama3RopeScaling, LlamaConfig, save_hf

SMOLLM2_135M = LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
    bos_id=1, eos_ids=(2,), max_position_embeddings=8192,
)  # fmt: skip
LLAMA3_1B = LlamaConfig(  # Llama-3.2-1B's shape
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
    num_kv_heads=8, head_dim=64, rope_theta=500000.0,
    rope_scaling=Llama3RopeScaling(32.0, 1.0, 4.0, 8192), rms_norm_eps=1e-5,
    tie_embeddings=True, bos_id=128000, eos_ids=(128001,), max_position_embeddings=131072,
)  # fmt: skip
SMOKE = dataclasses.replace(
    SMOLLM2_135M, vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
)  # fmt: skip
_HBM_GBS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}  # datasheet HBM bandwidth
_TUNIX_SCRIPT = pathlib.Path(__file__).resolve().parent / "peers" / "tunix_sampler.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments.bench.bench_sampler", description=__doc__.split("\n")[0]
    )
    p.add_argument("--shapes", default="8x8,64x1", help="B x N pairs to time, comma-separated")
    p.add_argument("--prompt_len", type=int, default=64, help="S: prompt tokens")
    p.add_argument("--new_tokens", type=int, default=64, help="T: new tokens per sample")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per figure (best)")
    p.add_argument("--transformers", action=argparse.BooleanOptionalAction, default=True,
                   help="also time transformers' PyTorch generate")  # fmt: skip
    p.add_argument("--model", choices=["smollm2", "llama3_1b"], default="smollm2")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--bandwidth_gbs", type=float, default=0.0,
                   help="memory bandwidth for the roofline (0: measured or known HBM)")  # fmt: skip
    p.add_argument("--out", default="", help="also write the kjax figures as JSON here")
    p.add_argument("--tunix_python", default=os.environ.get("KJAX_TUNIX_PYTHON", ""),
                   help="a python with google-tunix: also time Tunix's Sampler")  # fmt: skip
    p.add_argument(
        "--compact_floor",
        type=int,
        default=0,
        help="> 0: compaction mode, static vs compacting decode down to this many rows",
    )
    p.add_argument(
        "--stop_rate",
        type=float,
        default=0.02,
        help="compaction mode: share of the vocabulary that stops a sample",
    )
    p.add_argument("--smoke", action="store_true", help="tiny model and shapes: seconds")
    args = p.parse_args(argv)
    args.shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    if args.smoke:
        args.shapes, args.prompt_len, args.new_tokens, args.repeats = [(2, 2)], 8, 4, 1
    return args


def best_time(fn, repeats: int) -> float:
    """Best wall time of `repeats` calls of fn() (which blocks until its result is ready)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def machine_roofline(repeats: int, n: int = 2048, words: int = 64 * 2**20) -> tuple[float, float]:
    """(float32 matmul FLOP/s, memory read bandwidth bytes/s) measured with XLA here."""
    flops = matmul_peak(n, repeats + 2)
    x = jnp.ones((words,), jnp.float32)  # 256 MiB by default: far beyond the caches
    # Read bandwidth (a sum): decoding streams the weights and K/V, it writes little.
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    bandwidth = x.nbytes / best_time(lambda: total(x).block_until_ready(), repeats + 2)
    return flops, bandwidth


def flops_per_token(c: LlamaConfig, context: int) -> float:
    """Forward FLOPs of one new token: weight matmuls (unembedding included) + attention."""
    D, F, H, K, E = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    per_layer = D * H * E * 2 + D * K * E * 2 + 3 * D * F
    return 2 * (c.num_layers * per_layer + D * c.vocab_size) + 4 * c.num_layers * H * E * context


def kv_bytes(c: LlamaConfig, B: int, N: int, S: int, T: int, itemsize: int = 4) -> dict:
    """K/V bytes: kjax (prompt once per prompt + own tokens per sample) vs one cache per
    sample holding the prompt too (what `generate` with num_return_sequences keeps)."""
    per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize
    return {
        "kjax": per_token * (B * S + B * N * (T - 1)),
        "per_sample": per_token * B * N * (S + T),
    }


def hf_timings(weights_dir: str, jobs: list[tuple[int, int, int, int]], repeats: int) -> list:
    """Seconds of transformers' `generate` (sampling, no early stop) per (B, N, S, T) job,
    on the weights `save_hf` wrote. Runs in its own process: torch's OpenMP threads and
    XLA's thread pool slow each other down (2x measured here) when they share one."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM.from_pretrained(weights_dir, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    with torch.no_grad():  # warm-up: the first generate call pays one-time setup
        hf.generate(input_ids=torch.zeros((1, 4), dtype=torch.long), max_new_tokens=2)
    out = []
    for B, N, S, T in jobs:
        ids = torch.tensor(rng.integers(0, hf.config.vocab_size, (B, S)), dtype=torch.long)
        kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=N,
                  max_new_tokens=T, min_new_tokens=T, pad_token_id=0)  # fmt: skip
        with torch.no_grad():
            run = lambda: hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)  # noqa: B023
            out.append(best_time(run, repeats))
    return out


def tunix_timings(python: str, c: LlamaConfig, jobs: list[tuple[int, int, int, int]],
                  repeats: int) -> list:  # fmt: skip
    """Seconds of Tunix's Sampler per (B, N, S, T) job on config c's shape, run by
    experiments/bench/peers/tunix_sampler.py in the Tunix environment's python (after kjax's
    timings, so the two never share the cores)."""
    shape = dict(num_layers=c.num_layers, vocab_size=c.vocab_size, embed_dim=c.hidden_size,
                 hidden_dim=c.intermediate_size, num_heads=c.num_heads, head_dim=c.head_dim,
                 num_kv_heads=c.num_kv_heads, rope_theta=c.rope_theta, norm_eps=c.rms_norm_eps,
                 weight_tying=c.tie_embeddings)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tunix.json")
        spec = ",".join("x".join(map(str, job)) for job in jobs)
        cmd = [python, str(_TUNIX_SCRIPT), f"--config={json.dumps(shape)}", f"--jobs={spec}",
               f"--repeats={repeats}", f"--out={out}"]  # fmt: skip
        print("Tunix:", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, stdout=sys.stderr)  # keep stdout for the tables
        if done.returncode != 0:
            sys.exit(f"bench_sampler: the Tunix side failed (exit {done.returncode}); see above.")
        with open(out) as f:
            return [row["seconds"] for row in json.load(f)["jobs"]]


def main(argv=None) -> int:
    args = parse_args(argv)
    S, T, repeats = args.prompt_len, args.new_tokens, args.repeats
    c = SMOLLM2_135M if args.model == "smollm2" else LLAMA3_1B
    c = SMOKE if args.smoke else c
    dtype = jnp.dtype(args.dtype)
    shapes = args.shapes
    peak, bandwidth = machine_roofline(repeats, *((256, 2**20) if args.smoke else ()))
    kind = jax.devices()[0].device_kind
    known = [gbs for name, gbs in _HBM_GBS.items() if name.lower() in kind.lower()]
    if args.bandwidth_gbs or known:
        bandwidth = 1e9 * (args.bandwidth_gbs or known[0])
    model = Llama(c, rngs=nnx.Rngs(params=jax.random.key(0, impl="unsafe_rbg")),
                  param_dtype=dtype, dtype=dtype)  # fmt: skip
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params()))
    rng = np.random.default_rng(0)
    if args.compact_floor:
        return compaction(args, model, c, peak)

    def run(prompts, N, T_):
        mask = np.ones(prompts.shape, bool)
        out = sampling.sample(model, prompts, mask, key=jax.random.key(0), n=N, max_new_tokens=T_)
        return jax.block_until_ready(out)

    ours, compile_s = {}, {}
    for B, N in shapes:
        prompts = rng.integers(0, c.vocab_size, (B, S)).astype(np.int32)
        start = time.perf_counter()
        run(prompts, N, T)
        compile_s[B, N] = time.perf_counter() - start
        ours[B, N] = best_time(lambda: run(prompts, N, T), repeats)  # noqa: B023
    prompts = rng.integers(0, c.vocab_size, (8, S)).astype(np.int32)
    prefill = {}
    for N in (1, 16):
        run(prompts, N, 1)
        prefill[N] = best_time(lambda: run(prompts, N, 1), repeats)  # noqa: B023

    jobs = [(B, N, S, T) for B, N in shapes] + [(8, 1, S, 1), (8, 16, S, 1)]
    theirs = [float("nan")] * len(jobs)
    if args.transformers and dtype == jnp.float32:
        with tempfile.TemporaryDirectory() as weights_dir:
            save_hf(model, weights_dir)
            if args.smoke:  # its code path, not its figures: no new process to start
                theirs = hf_timings(weights_dir, jobs, 1)
            else:
                ctx = multiprocessing.get_context("spawn")  # a process without XLA threads
                with ctx.Pool(1) as pool:
                    theirs = pool.apply(hf_timings, (weights_dir, jobs, 1))
    tunix = [float("nan")] * len(shapes)
    # Tunix's Llama3 has no RoPE scaling (Llama-3.2-1B's shape needs it) and is timed in float32.
    if args.tunix_python and c.rope_scaling is None and dtype == jnp.float32:
        tunix = tunix_timings(args.tunix_python, c, jobs[: len(shapes)], repeats)
    elif not args.tunix_python:
        print("Tunix side skipped: no --tunix_python (or $KJAX_TUNIX_PYTHON) given.")
    else:
        print("Tunix side skipped: it times float32 models without RoPE scaling only.")

    print(
        f"devices: {jax.devices()}; float32 matmul peak {peak / 1e9:.0f} GFLOP/s, memory "
        f"bandwidth {bandwidth / 1e9:.1f} GB/s (measured now; noisy on a shared CPU)\n"
    )
    name = "smoke" if args.smoke else args.model
    print(f"{name} shape, {args.dtype}, random weights, S = {S}, T = {T}, "
          "temperature 1, no stop ids")  # fmt: skip
    rows = []
    print("| B x N | kjax tok/s | transformers tok/s | speedup | Tunix tok/s | vs Tunix | "
          "kjax compile s | % matmul peak | % bandwidth | KV bytes kjax | "
          "KV bytes, cache per sample |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (B, N), hf_s, tx_s in zip(shapes, theirs, tunix, strict=False):
        tok_s, hf_tok_s, tx_tok_s = B * N * T / ours[B, N], B * N * T / hf_s, B * N * T / tx_s
        flop_frac = tok_s * flops_per_token(c, S + T // 2) / peak
        kv = kv_bytes(c, B, N, S, T, dtype.itemsize)
        # A decode step reads every weight once plus, on average, half the final K/V.
        bw_frac = (tok_s / (B * N)) * (param_bytes + kv["kjax"] / 2) / bandwidth
        print(f"| {B} x {N} | {tok_s:.0f} | {hf_tok_s:.0f} | {tok_s / hf_tok_s:.1f}x | "
              f"{tx_tok_s:.0f} | {tok_s / tx_tok_s:.1f}x | {compile_s[B, N]:.0f} | "
              f"{100 * flop_frac:.0f}% | {100 * bw_frac:.0f}% | "
              f"{kv['kjax'] / 2**20:.1f} MiB | {kv['per_sample'] / 2**20:.1f} MiB |")  # fmt: skip
        rows.append({"B": B, "N": N, "S": S, "T": T, "kjax_tok_s": tok_s,
                     "transformers_tok_s": hf_tok_s, "tunix_tok_s": tx_tok_s,
                     "compile_s": compile_s[B, N],
                     "matmul_peak_fraction": flop_frac, "bandwidth_fraction": bw_frac})  # fmt: skip
    print(f"\nPrefill: the whole call at T = 1 (prefill + first draw), B = 8, S = {S}")
    print("| N | kjax s | transformers s |")
    print("|---|---|---|")
    for N, hf_s in zip((1, 16), theirs[-2:], strict=True):
        print(f"| {N} | {prefill[N]:.3f} | {hf_s:.3f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": name, "dtype": args.dtype, "device": kind,
                       "bandwidth_gbs": bandwidth / 1e9, "peak_gflops_measured": peak / 1e9,
                       "rows": rows, "prefill_s": {str(n): t for n, t in prefill.items()}},
                      f, indent=2, default=float)  # fmt: skip
    return 0


def compaction(args, model, c: LlamaConfig, peak: float) -> int:
    """Compaction mode: static vs compacting decode, alternating, best of args.repeats each."""
    S, T = args.prompt_len, args.new_tokens
    stops = tuple(range(max(1, round(args.stop_rate * c.vocab_size))))
    rng = np.random.default_rng(0)
    print(f"devices: {jax.devices()}; float32 matmul peak {peak / 1e9:.0f} GFLOP/s (measured "
          f"now); {args.model if not args.smoke else 'smoke'} shape, random weights, S = {S}, "
          f"T = {T}, temperature 1, stop ids 0..{len(stops) - 1} of {c.vocab_size}\n")  # fmt: skip
    print(
        "| B x N | mean length | at cap | padding static | padding compacting | "
        "static s | compacting s | speedup | compile s static / compacting | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for B, N in args.shapes:
        prompts = rng.integers(0, c.vocab_size, (B, S)).astype(np.int32)
        mask = np.ones(prompts.shape, bool)
        sizes = sampling.compact_sizes(B * N, args.compact_floor)

        def run(floor, prompts=prompts, mask=mask, N=N):
            out = sampling.sample(model, prompts, mask, key=jax.random.key(0), n=N,
                                  max_new_tokens=T, stop_ids=stops,
                                  compact_floor=floor)  # fmt: skip
            return jax.block_until_ready(out)

        compile_s, times, outs = {}, {0: [], args.compact_floor: []}, {}
        for floor in times:
            start = time.perf_counter()
            outs[floor] = run(floor)
            compile_s[floor] = time.perf_counter() - start
        for _ in range(args.repeats):  # alternating: both see the same load
            for floor in times:
                times[floor].append(best_time(lambda floor=floor: run(floor), 1))
        lengths = np.asarray(outs[0].lengths)
        live, run_static = sampling.decode_row_steps(lengths, (B * N,))
        _, run_compact = sampling.decode_row_steps(lengths, sizes)
        same = bool(np.array_equal(outs[0].tokens, outs[args.compact_floor].tokens))
        static_s, compact_s = min(times[0]), min(times[args.compact_floor])
        row = {"B": B, "N": N, "S": S, "T": T, "sizes": sizes,
               "mean_length": float(lengths.mean()), "at_cap": float(np.mean(lengths == T)),
               "padding_static": 1 - live / max(run_static, 1),
               "padding_compacting": 1 - live / max(run_compact, 1),
               "static_s": static_s, "compacting_s": compact_s,
               "compile_static_s": compile_s[0],
               "compile_compacting_s": compile_s[args.compact_floor],
               "same_tokens": same}  # fmt: skip
        rows.append(row)
        print(f"| {B} x {N} | {row['mean_length']:.1f} | {100 * row['at_cap']:.0f}% | "
              f"{100 * row['padding_static']:.0f}% | {100 * row['padding_compacting']:.0f}% | "
              f"{static_s:.2f} | {compact_s:.2f} | {static_s / compact_s:.2f}x | "
              f"{compile_s[0]:.0f} / {compile_s[args.compact_floor]:.0f} | {same} |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": "smoke" if args.smoke else args.model, "mode": "compaction",
                       "compact_floor": args.compact_floor, "stop_ids": len(stops),
                       "peak_gflops_measured": peak / 1e9, "rows": rows}, f, indent=2)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
