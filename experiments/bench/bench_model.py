"""Llama throughput at the SmolLM2-135M shape: kjax (JAX) vs transformers (PyTorch), MFU.

Command: python -m experiments.bench.bench_model [--batch 16 --seq 128 --repeats 3] [--family qwen3]
[--lora 16]
(--family: that family at the same shape, with kjax's Llama timed in the same run.
--lora R: also kjax's update of rank-R adapters on every projection, base frozen
(kjax.models.lora), timed round-robin with the full update in the same run; its
GFLOP/s counts 2x the forward, as no weight gradient of the frozen base is formed.)
Hardware: whatever runs it (float32; the peak is measured here, not looked up).
Runtime: ~4 minutes on 2 quiet CPU cores. Prints a Markdown table. --smoke (seconds; the
default test tier runs it so the benchmark cannot rot): a 2-layer d=32 model at [2, 16].
Measured so (2026-12-01, quiet machine, one run each): at a7a7897 (the layer scan saves
only named residuals) peak 142 GFLOP/s; kjax fwd 330 tok/s, fwd+bwd 89 tok/s; PyTorch fwd
324 tok/s, fwd+bwd 109 tok/s: kjax fwd+bwd 0.82x PyTorch. The run before it, same day:
kjax 339 / 88, PyTorch 293 / 115 (0.77x). The machine's speed drifts by ~30% between runs,
so only ratios within one run compare. Where the rest goes (profile, 30 layers): the
backward loop runs at ~300 ms per layer, near PyTorch's; the forward that stores residuals
(its zero-filled stacked buffers, ~0.9 s, and the residual writes) is the remaining gap.
--family qwen3 (2026-12-05, AMD EPYC, 2 cores shared with four other jobs, load ~11, so
absolute rates and the peak probe are unreliable; kjax Qwen3 / kjax Llama in the same
run): 30 layers, repeats 3: fwd 99/83 tok/s (1.19x), fwd+bwd 31/30 (1.03x), peak 24
GFLOP/s; 12 layers, repeats 5: fwd 292/341 (0.86x), fwd+bwd 94/92 (1.02x), peak 46;
6 layers, repeats 9: fwd 617/613 (1.01x), fwd+bwd 182/186 (0.98x), peak 63. fwd+bwd
agrees within 3% in all three; the forward ratio swung from 0.86x to 1.19x with the load
(1.01x with the most repeats). The q/k norms add elementwise work only.
--lora 16 (2026-12-06, at 552a9fc, UNDER LOAD: 2 cores shared by six engineers' jobs, load
average ~25; 6 layers, [8,128], repeats 5, one run): full update 79 tok/s, LoRA r16 update
114 tok/s: 1.43x; peak probe 31 GFLOP/s. The same run timed the LoRA forward (strictly more
work than the plain one) at 310 vs 240 tok/s, so the load moves these figures by ~30%:
the issue's 1.6x goal at 30 layers on a quiet machine is not yet measured.
--lora 16, 30 layers (2026-12-06, at 22e417c, UNDER LOAD: 2 cores shared with five other
helpers' jobs, load average falling from ~25 to ~12 during the run, this run at nice 19;
[8,128], repeats 3, one run): full update 27 tok/s, LoRA r16 update 40 tok/s: 1.51x; peak
probe 29 GFLOP/s (unreliable so loaded); the LoRA forward (more work than the plain one)
timed 120 vs 107 tok/s, so the load moved these figures by >= 12%. The FLOP bound of this
ratio (docs/models.md, LoRA): 1.41x at 30 layers, at most 1.5x with free adapters.
Nothing else running (2026-12-06, be20838, load average falling 3.6 -> 2.0, `--batch=8
--seq=128 --repeats=3 --lora=16`, peak 194 GFLOP/s): full update 196 tok/s (84% MFU),
LoRA 253 tok/s (72%): 1.29x.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kjax.models import Family, Llama, LlamaConfig, forward, lora

SMOLLM2_135M = LlamaConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_embeddings=True,
)


def model_flops_per_token(c: LlamaConfig, seq: int) -> float:
    """Forward matmul FLOPs per token: 2 * (matmul parameters) + attention scores and
    values over the full [S,S] square (what both implementations compute)."""
    per_layer = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    per_layer += 3 * c.hidden_size * c.intermediate_size
    matmul_params = c.num_layers * per_layer + c.hidden_size * c.vocab_size
    attention = c.num_layers * 2 * 2 * seq * c.num_heads * c.head_dim
    return 2.0 * matmul_params + attention


def best_times(fns: dict, repeats: int) -> dict:
    """Best wall-clock seconds of each function over `repeats` round-robin passes.

    Round-robin (after one warm-up/compile pass) gives every function the same share of
    a machine other processes may be using; best-of is the least disturbed run.
    """
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


# --smoke's model: the benchmark's code paths in seconds, not its figures.
SMOKE = dataclasses.replace(
    SMOLLM2_135M, vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8,
)  # fmt: skip


def matmul_fns(sizes=(2048, 4096)) -> dict:
    """Square float32 matmuls in JAX and PyTorch; the best is the attainable peak."""
    import torch

    mm = jax.jit(lambda x: x @ x)
    fns = {}
    for n in sizes:
        a, ta = jax.random.normal(jax.random.key(0), (n, n), jnp.float32), torch.randn(n, n)
        fns[f"matmul_jax_{n}"] = lambda a=a: mm(a).block_until_ready()
        fns[f"matmul_torch_{n}"] = lambda ta=ta: ta @ ta
    return fns


def kjax_fns(config, tokens, lora_rank: int = 0) -> dict:
    """kjax's forward and fwd+bwd; with lora_rank, the gradient is the adapters' alone."""
    model = nnx.jit(
        lambda: Llama(config, rngs=nnx.Rngs(params=jax.random.key(0, impl="unsafe_rbg")))
    )()
    params = model.params()
    if lora_rank:
        params = lora.attach(params, lora.LoraConfig(rank=lora_rank), jax.random.key(2))

    def loss(params, tokens):
        # Next-token cross-entropy as logsumexp - picked logit over all S positions (the
        # last one weighted 0): no [B,S,V] log_softmax or slice is materialized.
        logits = forward(params, config, tokens)
        targets = jnp.roll(tokens, -1, axis=1)
        weights = jnp.ones(tokens.shape).at[:, -1].set(0.0)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        nll = jax.nn.logsumexp(logits, axis=-1) - picked
        return jnp.sum(nll * weights) / jnp.sum(weights)

    fwd = jax.jit(lambda p, t: forward(p, config, t))
    step = jax.jit(jax.value_and_grad(loss))
    if lora_rank:
        trainable, frozen = lora.split(params)
        grad = jax.jit(jax.value_and_grad(lambda t, f, x: loss(lora.join(t, f), x)))
        return {
            "lorakjax_fwd": lambda: fwd(params, tokens).block_until_ready(),
            "lorakjax_step": lambda: jax.block_until_ready(grad(trainable, frozen, tokens)),
        }
    return {
        "kjax_fwd": lambda: fwd(params, tokens).block_until_ready(),
        "kjax_step": lambda: jax.block_until_ready(step(params, tokens)),
    }


def torch_fns(config, tokens) -> dict:
    import torch
    import transformers

    hf = config.to_hf()
    hf_config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    model = transformers.AutoModelForCausalLM.from_config(hf_config).float()
    ids = torch.tensor(np.asarray(tokens), dtype=torch.long)

    def fwd():
        with torch.no_grad():
            model(input_ids=ids)

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    return {"torch_fwd": fwd, "torch_step": step}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=30, help="fewer for a quick look")
    parser.add_argument("--smoke", action="store_true", help="tiny model and shapes: seconds")
    parser.add_argument("--family", default="llama", choices=[f.value for f in Family])
    parser.add_argument("--lora", type=int, default=0, help="also time a rank-R LoRA update")
    args = parser.parse_args(argv)
    if args.lora < 0:
        parser.error(f"--lora must be >= 0 (0: no LoRA rows); got {args.lora}.")
    llama = dataclasses.replace(SMOLLM2_135M, num_layers=args.layers)
    sizes = (2048, 4096)
    if args.smoke:
        llama, sizes = SMOKE, (256,)
        args.batch, args.seq, args.repeats, args.layers = 2, 16, 1, SMOKE.num_layers
    config = dataclasses.replace(llama, family=Family(args.family))
    n = args.batch * args.seq
    tokens = jax.random.randint(jax.random.key(1), (args.batch, args.seq), 0, config.vocab_size)
    fns = matmul_fns(sizes) | kjax_fns(config, tokens) | torch_fns(config, tokens)
    rows = [("kjax (JAX)", "kjax"), ("transformers (PyTorch)", "torch")]
    if config != llama:  # the same shape as a Llama, timed round-robin in this run
        fns |= {f"llama{k}": fn for k, fn in kjax_fns(llama, tokens).items()}
        rows.append(("kjax Llama, same shape (JAX)", "llamakjax"))
    if args.lora:
        fns |= kjax_fns(config, tokens, args.lora)
        rows.append((f"kjax LoRA r{args.lora}, base frozen (JAX)", "lorakjax"))
    t = best_times(fns, args.repeats)
    rates = {k: 2 * int(k.rsplit("_", 1)[1]) ** 3 / v for k, v in t.items() if "matmul" in k}
    peak = max(rates.values())
    flops = model_flops_per_token(config, args.seq)
    probes = ", ".join(f"{k[7:]} {r / 1e9:.0f}" for k, r in rates.items())
    shape = "smoke model" if args.smoke else "SmolLM2-135M shape"
    print(
        f"{shape} ({args.layers} layers, family {args.family}), "
        f"[B,S]=[{args.batch},{args.seq}], float32, "
        f"{jax.device_count()} {jax.default_backend()} device(s); float32 matmul peak "
        f"{peak / 1e9:.0f} GFLOP/s (best of {probes})\n"
    )
    header = (
        "| implementation | fwd tok/s | fwd GFLOP/s (MFU) | fwd+bwd tok/s | fwd+bwd GFLOP/s (MFU) |"
    )
    print(header + "\n|---|---|---|---|---|")
    for name, key in rows:
        t_fwd, t_step = t[f"{key}_fwd"], t[f"{key}_step"]
        passes = 2 if key == "lorakjax" else 3  # LoRA: no weight gradient of the base
        f_fwd, f_step = n * flops / t_fwd, passes * n * flops / t_step
        print(
            f"| {name} | {n / t_fwd:.0f} | {f_fwd / 1e9:.0f} ({f_fwd / peak:.0%}) "
            f"| {n / t_step:.0f} | {f_step / 1e9:.0f} ({f_step / peak:.0%}) |"
        )
    if args.lora:
        print(
            f"\nLoRA r{args.lora} update / full update (fwd+bwd time, best of "
            f"{args.repeats}, round-robin in this run): "
            f"{t['kjax_step'] / t['lorakjax_step']:.2f}x faster"
        )


if __name__ == "__main__":
    main()
