"""The RL update's loss+grad on the reference path vs the shared-prompt path (issue 13).

Used by experiments.bench.bench_rl_step (--paths). Each path is one jitted value_and_grad of a
PG loss, -sum(A * logp * mask) / (B*N), built on kjax.rl.forward.completion_logprobs:
  reference: shared_prompt=False (prompt repeated N times, logits at every position)
  shared:    shared_prompt=True (prompt once, completion-only chunked log-probs)
timed interleaved (best of `repeats`, so both see the same machine load), with the peak
temporary memory XLA reports for each compiled computation and its FLOPs.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kjax.models import Llama, LlamaConfig
from kjax.rl import forward

SHAPES = {  # (LlamaConfig, B, S, N, T)
    "smollm2": (
        LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                    num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_embeddings=True),
        2, 128, 8, 64,
    ),
    # experiments/configs/tiny_arith.py's model and batch (its char vocabulary is ~20 ids).
    "tiny_arith": (
        LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=192, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16),
        16, 12, 16, 5,
    ),
}  # fmt: skip


def _inputs(config: LlamaConfig, B, S, N, T):
    rng = np.random.default_rng(0)
    mask = np.ones((B, S), bool)
    mask[: B // 2, : S // 4] = False  # half the prompts left-padded
    prompts = np.where(mask, rng.integers(0, config.vocab_size, (B, S)), 0)
    tokens = rng.integers(0, config.vocab_size, (B, N, T))
    lengths = rng.integers(1, T + 1, (B, N, 1))
    return dict(
        prompts=jnp.asarray(prompts, jnp.int32),
        prompt_mask=jnp.asarray(mask),
        tokens=jnp.asarray(tokens, jnp.int32),
        mask=jnp.asarray(np.arange(T) < lengths),
        advantages=jnp.asarray(rng.standard_normal((B, N)), jnp.float32),
    )


def model_flops(config: LlamaConfig, B, S, N, T, shared: bool) -> float:
    """Matmul FLOPs of forward+backward (3x forward) of one path, counted by hand (XLA's
    cost analysis counts a scan body once, not once per layer). Attention counts every
    (query, key) pair of the scores it computes (masked ones too)."""
    c = config
    D, F, H, K, E, L = (c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads,
                        c.head_dim, c.num_layers)  # fmt: skip
    per_row = D * (2 * H * E + 2 * K * E) + 3 * D * F
    if shared:
        layer_rows, unembed_rows = B * (S + N * T), B * N * T
        pairs = B * (S * S + N * T * S + N * T * T)
    else:
        layer_rows = unembed_rows = B * N * (S + T)
        pairs = B * N * (S + T) ** 2
    forward = 2 * (L * per_row * layer_rows + D * c.vocab_size * unembed_rows)
    return 3.0 * (forward + L * 4 * H * E * pairs)


def _loss_and_grad(config: LlamaConfig, shared: bool, dtype):
    def loss(params, batch):
        logp = forward.completion_logprobs(
            params, config, batch["prompts"], batch["prompt_mask"], batch["tokens"],
            shared_prompt=shared, dtype=dtype,
        ).logprobs  # fmt: skip
        B, N = batch["advantages"].shape
        return -jnp.sum(batch["advantages"][..., None] * logp * batch["mask"]) / (B * N)

    return jax.jit(jax.value_and_grad(loss))


def compare(shape: str, repeats: int = 3, dtype=jnp.float32, peak_tflops: float = 0.0) -> dict:
    """Times and memory of both paths at one shape; returns a JSON-able dict (MFU when
    peak_tflops > 0). dtype: compute dtype (params stay float32, as in training)."""
    config, B, S, N, T = SHAPES[shape]
    params = nnx.jit(
        lambda: Llama(config, rngs=nnx.Rngs(params=jax.random.key(0, impl="unsafe_rbg")))
    )().params()
    batch = _inputs(config, B, S, N, T)
    paths, out = {}, {"shape": shape, "B": B, "S": S, "N": N, "T": T}
    for name, shared in (("reference", False), ("shared", True)):
        fn = _loss_and_grad(config, shared, dtype)
        compiled = fn.lower(params, batch).compile()
        mem = compiled.memory_analysis()
        out[name] = {
            "temp_bytes": int(mem.temp_size_in_bytes),
            "flops": model_flops(config, B, S, N, T, shared),
            "loss": float(compiled(params, batch)[0]),  # also the warm-up call
        }
        paths[name] = compiled
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(repeats):
        for name, fn in paths.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(params, batch))
            best[name] = min(best[name], time.perf_counter() - start)
    tokens = B * N * (S + T)
    for name, seconds in best.items():
        out[name]["seconds"] = seconds
        out[name]["tokens_per_s"] = tokens / seconds
        if peak_tflops:
            out[name]["mfu"] = out[name]["flops"] / seconds / 1e12 / peak_tflops
    out["dtype"] = jnp.dtype(dtype).name
    out["speedup"] = best["reference"] / best["shared"]
    out["loss_diff"] = abs(out["reference"]["loss"] - out["shared"]["loss"])
    out["devices"] = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    return out


def table(results: list[dict]) -> str:
    rows = [
        "Update loss+grad (PG on completion_logprobs), reference vs shared-prompt path, "
        "interleaved in this run (tok/s counts B*N*(S+T) tokens for both; GFLOP: each "
        "path's own matmul FLOPs, counted by hand):\n",
        "| shape | B x N, S + T | dtype | reference s | shared s | speedup | reference tok/s "
        "| shared tok/s | reference MFU | shared MFU | reference peak temp MiB "
        "| shared peak temp MiB | reference GFLOP | shared GFLOP | |loss diff| |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ref, new = r["reference"], r["shared"]
        mfu = lambda x: f"{x['mfu']:.1%}" if "mfu" in x else "-"  # noqa: E731
        rows.append(
            f"| {r['shape']} | {r['B']} x {r['N']}, {r['S']} + {r['T']} | {r['dtype']} "
            f"| {ref['seconds']:.3f} | {new['seconds']:.3f} | {r['speedup']:.2f}x "
            f"| {ref['tokens_per_s']:,.0f} | {new['tokens_per_s']:,.0f} | {mfu(ref)} "
            f"| {mfu(new)} | {ref['temp_bytes'] / 2**20:,.0f} | {new['temp_bytes'] / 2**20:,.0f} "
            f"| {ref['flops'] / 1e9:,.1f} | {new['flops'] / 1e9:,.1f} | {r['loss_diff']:.1e} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":  # quick look: python -m experiments.bench.update_paths [shape ...]
    import sys

    print(table([compare(s) for s in (sys.argv[1:] or ["tiny_arith"])]))
