"""Analytic counts the compiled programs are checked against (FLOPs of the update and of a
decode step, parameter counts) and the synchronous-vs-asynchronous step projection."""

from __future__ import annotations

import dataclasses
import math

from kjax.models.config import LlamaConfig
from kjax.rl.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Shape:
    """One RL step's shape: B prompts x N samples, prompts of S tokens, T new tokens."""

    B: int
    N: int
    S: int
    T: int

    @classmethod
    def of(cls, cfg: TrainConfig) -> Shape:
        S = cfg.task.max_prompt_tokens
        if not S:
            raise ValueError(
                "config.task.max_prompt_tokens is 0 (the prompt width comes from the data); "
                "set it, e.g. --config.task.max_prompt_tokens=512"
            )
        return cls(cfg.batch_prompts, cfg.samples, S, cfg.max_new_tokens)


def matmul_params(c: LlamaConfig) -> int:
    """Parameters of the layers' matmuls (q, k, v, o, gate, up, down), all L layers."""
    D, F, H, K, E = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    return c.num_layers * (2 * D * H * E + 2 * D * K * E + 3 * D * F)


def param_count(c: LlamaConfig) -> int:
    """All parameters: layers, norms, the embedding and (untied) the head."""
    D, L = c.hidden_size, c.num_layers
    heads = 1 if c.tie_embeddings else 2
    return matmul_params(c) + 2 * L * D + D + heads * c.vocab_size * D


def forward_flops(c: LlamaConfig, shape: Shape) -> float:
    """Model FLOPs of one forward of the update's shared-prompt pass over all B groups
    (kjax.rl.forward): 2 x matmul params x B (S + N T) tokens, the head on the N T
    completion positions, and attention as computed (masked blocks included): prompt
    S x S, completions x prompt N T x S, completions x own N T x T."""
    B, N, S, T = shape.B, shape.N, shape.S, shape.T
    head = 2 * c.hidden_size * c.vocab_size * B * N * T
    attention = 4 * c.num_heads * c.head_dim * c.num_layers * B * (S * S + N * T * (S + T))
    return 2 * matmul_params(c) * B * (S + N * T) + head + attention


def update_flops(c: LlamaConfig, cfg: TrainConfig, shape: Shape) -> float:
    """Analytic FLOPs of one RL update: epochs x (forward + backward = 3 forwards, the
    6 x params x tokens rule) over the batch, plus one forward per frozen log-prob pass
    (PPO / TIS old policy, KL reference)."""
    frozen = int(cfg.rl.needs_old_logprobs) + int(cfg.rl.kl_coef > 0)
    return (3 * cfg.rl.epochs + frozen) * forward_flops(c, shape)


def decode_flops(c: LlamaConfig, shape: Shape, window: int) -> float:
    """Analytic FLOPs of one decode step of B x N rows attending S prompt keys, `window`
    own keys and themselves."""
    rows = shape.B * shape.N
    attention = 4 * c.num_heads * c.head_dim * c.num_layers * rows * (shape.S + window + 1)
    return 2 * (matmul_params(c) + c.hidden_size * c.vocab_size) * rows + attention


def overlap_projection(sampler_s: float, update_s: float, host_s: float = 0.0) -> dict:
    """Projected seconds of one RL step, synchronous against asynchronous (rl.policy_lag >= 1),
    from the sampler's and the update's projected seconds on the whole slice and the host's
    (detokenize, verify, advantages) seconds per step.

    Assumes each program's time scales as 1 / its chips (the roofline of both is per-chip
    FLOPs and bytes, which split with B while B per chip stays whole) and ignores the
    parameter copy to the sampling group. Returns:
      sync:        sampler + host + update (kjax.rl.loop.rl_step).
      one_group:   sampler + max(host, update): the same chips, the host's verification of
                   step t + d overlapping step t's update (loop.lagged_step).
      split:       the best split of the chips into a sampling group (fraction f) and a
                   training group: max(sampler / f + host, update / (1 - f)), and f.
    """
    sync = sampler_s + host_s + update_s
    one_group = sampler_s + max(host_s, update_s)
    best, best_f = math.inf, 0.0
    for i in range(1, 1000):
        f = i / 1000
        t = max(sampler_s / f + host_s, update_s / (1 - f))
        if t < best:
            best, best_f = t, f
    return {"sync": sync, "one_group": one_group, "split": best, "split_fraction": best_f}


_SPLASH_FLOPS = {"fwd": 4, "dq": 6, "dkv": 8}  # per query element x key, see below


def attention_density(S: int, N: int = 0, T: int = 0) -> float:
    """The share of a row's [L, L] score entries (L = S + N T) that kjax's attention
    leaves unmasked: the prompt causal, each of the N completions of T attending to the
    whole prompt and causally to itself (kjax.models.attention's mask; N T = 0 is a causal
    prompt alone, the prefill)."""
    L = S + N * T
    return (S * (S + 1) / 2 + N * T * S + N * T * (T + 1) / 2) / L**2


def splash_attention_cost(density: float = 1.0):
    """A `kernel_cost` hook (kjax.hlo_stats.module_stats) for jax's Pallas splash
    attention kernels (`splash_{mha,mqa}_{fwd,dq,dkv}...`), None for any other kernel.

    FLOPs from the shapes of q [..., Lq, E] and k [..., Lk, E] (their first two float
    operands) times `density`, the share of the Lq x Lk score blocks the mask leaves to
    compute: per head and score entry, the forward 2 E for the scores and 2 E for
    probabilities x values (4), dq 6 (scores again, dP = dO V^T, dQ = dS K), dkv 8
    (scores, dP, dV = P^T dO, dK = dS^T Q), and 10 when dkv also returns dq (the fused
    backward). Bytes: operands and results once, a lower bound (the kernel reads K and V
    once per query block)."""
    from kjax import hlo_stats

    def cost(kernel):
        parts = kernel.name.split("_")
        if len(parts) < 3 or parts[0] != "splash" or parts[2] not in _SPLASH_FLOPS:
            return None
        floats = [
            dims
            for t in kernel.operands
            for dtype, dims in hlo_stats._arrays(t)
            if dtype in ("bf16", "f16", "f32") and len(dims) >= 2
        ]
        q, k = floats[0], floats[1]
        per_entry = _SPLASH_FLOPS[parts[2]]
        grads = [d for dtype, d in hlo_stats._arrays(kernel.result) if d == q]
        if parts[2] == "dkv" and len(grads) >= 3:
            per_entry = 10  # dq, dk and dv from one kernel
        flops = per_entry * math.prod(q) * k[-2] * density
        moved = hlo_stats._hbm(kernel.result) + sum(hlo_stats._hbm(t) for t in kernel.operands)
        return hlo_stats.KernelCost(float(flops), float(moved))

    return cost
