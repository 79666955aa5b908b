"""Why a seed axis does not speed the tiny tables up on a CPU: the RL update's gradient
(kjax.rl.forward.completion_logprobs, fwd + bwd) of one batch, of S batches vmapped over
S parameter sets (a lockstep seed axis), and of S batches stacked into one batch with one
parameter set. Prints ms per batch (medians of 5 repeats of 30 calls).

  python -m experiments.bench.seed_axis_grad [--seeds=4]

The model is the tiny tables' shape (tiny_arith: 2 layers of 64, 4 heads, 2 KV heads,
MLP 256, 20 tokens); a batch is B = 16 prompts of 10 tokens x N = 16 completions of 5.
A benchmark, not a test: note the machine's load with the figures.
"""

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kjax.models import Llama, LlamaConfig
from kjax.rl import forward

CONFIG = LlamaConfig(vocab_size=20, hidden_size=64, intermediate_size=256, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=True, bos_id=1,
                     eos_ids=(2,), max_position_embeddings=256)  # fmt: skip
B, N, T, S = 16, 16, 5, 10


def loss(params, prompts, mask, tokens):
    return forward.completion_logprobs(params, CONFIG, prompts, mask, tokens).logprobs.sum()


def ms_per_call(fn, *args, calls: int = 30, repeats: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append(1e3 * (time.perf_counter() - t0) / calls)
    return statistics.median(times)


def agree(grad, vgrad, params, prompts, mask, tokens, seeds: int) -> float:
    """The largest relative |difference| between the three forms' gradients, which must
    agree: each of the S vmapped gradients (vgrad) is the single batch's, and the stacked
    batch's is S times it (the loss sums over the batch)."""
    one = grad(params, prompts, mask, tokens)
    stack = lambda x: jnp.stack([x] * seeds)  # noqa: E731
    cat = lambda x: jnp.concatenate([x] * seeds)  # noqa: E731
    vmapped = vgrad(jax.tree.map(stack, params), stack(prompts), stack(mask), stack(tokens))
    stacked = grad(params, cat(prompts), cat(mask), cat(tokens))
    worst = 0.0
    leaves = zip(*map(jax.tree.leaves, (one, vmapped, stacked)), strict=True)
    for a, v, s in leaves:
        scale = 1.0 + float(jnp.max(jnp.abs(a)))
        worst = max(worst, float(jnp.max(jnp.abs(v - a[None]))) / scale)
        worst = max(worst, float(jnp.max(jnp.abs(s - seeds * a))) / (seeds * scale))
    return worst


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument(
        "--smoke", action="store_true", help="1 repeat of 2 calls (CI: runs, not timings)"
    )
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1; got {args.seeds}")
    seeds = args.seeds
    timing = dict(calls=2, repeats=1) if args.smoke else {}
    params = Llama(CONFIG, rngs=nnx.Rngs(params=jax.random.key(0))).params()
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(3, 20, (B, S)), jnp.int32)
    mask = jnp.ones((B, S), bool)
    tokens = jnp.asarray(rng.integers(3, 20, (B, N, T)), jnp.int32)
    grad = jax.jit(jax.grad(loss))
    stack = lambda x: jnp.stack([x] * seeds)  # noqa: E731
    cat = lambda x: jnp.concatenate([x] * seeds)  # noqa: E731
    one = ms_per_call(grad, params, prompts, mask, tokens, **timing)
    args_ = (jax.tree.map(stack, params), stack(prompts), stack(mask), stack(tokens))
    vgrad = jax.jit(jax.vmap(jax.grad(loss)))
    vmapped = ms_per_call(vgrad, *args_, **timing) / seeds
    stacked = ms_per_call(grad, params, cat(prompts), cat(mask), cat(tokens), **timing) / seeds
    worst = agree(grad, vgrad, params, prompts, mask, tokens, seeds)
    print(f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"gradient of one {B} x {N} batch: {one:.1f} ms")
    print(f"{seeds} batches vmapped over {seeds} parameter sets: {vmapped:.1f} ms per batch")
    print(f"{seeds} batches stacked into one, one parameter set: {stacked:.1f} ms per batch")
    print(f"the three gradients agree to {worst:.1e} (relative)")
    return dict(one_ms=one, vmapped_ms=vmapped, stacked_ms=stacked, disagreement=worst)


if __name__ == "__main__":
    main()
