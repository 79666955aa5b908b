"""An analytic estimate of what one chip holds in the RL update and in the sampler, term
by term, for ordering meshes before compiling them (experiments.plan_scale --search).
The compiler's peak is the measurement; tests/test_scale_memory.py holds these
estimates to the committed compiled summaries (experiments/results/plan_scale/*.json).

The update's peak falls in the backward of the layer scan, while every layer's saved
residuals are alive (kjax.models.llama.SAVED_RESIDUALS; read off the buffer assignment
of the compiled 8B MATH update, 4 layers, v5e:2x4, mesh 1x1x8):
  state: STATE_COPIES copies of the params per chip, FSDP_COPIES more where fsdp > 1
    (below);
  residuals: per layer and token of one microbatch, the layer input and the residual
    after attention (x_mid), each D wide, split over tensor along the positions where
    tensor divides them (kjax.sharding.constrain_residual; `stream_split=False` models
    the programs compiled before it, whole on every tensor device), plus q, k, v, the
    attention output and the MLP's gate and up, split over tensor (k and v one kv head
    per tensor device where the training forward repeats them:
    kjax.models.attention.kv_weights_per_query_head), and the float32 attention
    log-sum-exp;
  workspace: the larger of one layer's backward (WORKSPACE_ROWS residual-stream-sized
    [tokens, D] buffers, plus the layer's weights gathered over fsdp and their gradient)
    and the loss head's (the final hidden states and their float32 cotangent, the
    head's [V/tensor, D] block gathered and its gradient, a chunk of float32 logits).
"""

from __future__ import annotations

import dataclasses

from kjax.models.config import LlamaConfig
from kjax.sampler_weights import SamplerWeights
from kjax.scale.costs import Shape, matmul_params, param_count

# [tokens, D] buffers one layer's backward holds beside the saved residuals (the layer
# input and x_mid sliced from their stacks, their norms, the residual stream's
# cotangent, the projections' outputs and input cotangents): 12 in the buffer
# assignment of the compiled 8B MATH update (v5e:2x4, 1x1x8, 16,896 tokens).
WORKSPACE_ROWS = 12
# Copies of the params per chip the update holds: its arguments (params and Adam's two
# moments, kjax.rl.train_step) and the gradients (the microbatch accumulator and one
# microbatch's). Where fsdp > 1 the compiled updates hold about FSDP_COPIES more, not
# itemised: the committed summaries (all at fsdp 8 to 32) imply 6.9 to 10.2 copies in all
# (peak - residuals - workspace, over params per chip; median 8), and the fsdp-1 compiles
# 4.9 to 5.3 (the H100 tensor-8 summary; the 8B at 2 and 4 layers on v5e:2x4, 1x1x8,
# compiled for this estimate and not committed). FSDP_COPIES = 3 is calibrated from them,
# and tests/test_scale_memory.py checks it against the summaries.
STATE_COPIES = 5
FSDP_COPIES = 3
_HEAD_CHUNK_ROWS = 4096  # kjax.rl.forward's row chunk (_MAX_CHUNK_ROWS)
_HEAD_CHUNK_LOGITS = 1 << 23  # and its float32 logits per chunk (_CHUNK_ELEMENTS)
AUTO_SHARE = 0.8  # kjax.sampler_layout._AUTO_SHARE


def kv_heads_per_chip(c: LlamaConfig, tensor: int, kernel: bool = True) -> float:
    """kv heads of k and v one chip computes in the training forward: K / tensor where
    tensor divides K; one where tensor is a multiple of K dividing H and the splash
    kernel's forward repeats the k/v weights (`kernel`); else all K."""
    K, H = c.num_kv_heads, c.num_heads
    if K % tensor == 0:
        return K / tensor
    if kernel and tensor % K == 0 and H % tensor == 0:
        return 1.0
    return float(K)


def _group_tokens(shape: Shape, mesh_sizes, microbatches: int, minibatches: int) -> float:
    data, fsdp, _ = mesh_sizes
    groups = shape.B / (minibatches * microbatches * data * fsdp)
    return groups * (shape.S + shape.N * shape.T)


@dataclasses.dataclass(frozen=True)
class UpdateMemory:
    """The update's bytes per chip by term (module docstring); `total` is the estimate."""

    state: float
    residuals: float
    layer_workspace: float
    head_workspace: float

    @property
    def total(self) -> float:
        return self.state + self.residuals + max(self.layer_workspace, self.head_workspace)


def update_memory(c: LlamaConfig, shape: Shape, mesh_sizes, microbatches: int, minibatches: int,
                  itemsize: int, act_itemsize: int | None = None, remat: bool = False,
                  kernel: bool = True, stream_split: bool = False) -> UpdateMemory:  # fmt: skip
    """The update's bytes per chip on mesh (data, fsdp, tensor) with `microbatches`, by
    term. itemsize: the params' (and Adam's moments') bytes; act_itemsize: the compute
    dtype's (default itemsize); remat: only each layer's input is saved and one layer's
    residuals are recomputed at a time; kernel: the splash attention forward (TPU);
    stream_split: the residual stream between layers split over tensor along its
    positions, as the training forward lays it out under rl.sequence_parallel where
    tensor divides S + N*T (False: whole, the default program)."""
    _, fsdp, tensor = mesh_sizes
    act = itemsize if act_itemsize is None else act_itemsize
    H, E, D, F, L = c.num_heads, c.head_dim, c.hidden_size, c.intermediate_size, c.num_layers
    tokens = _group_tokens(shape, mesh_sizes, microbatches, minibatches)
    kv = kv_heads_per_chip(c, tensor, kernel)
    split = (2 * H * E + 2 * kv * E * tensor + 2 * F) / tensor  # q, attn_out, k, v, gate, up
    stream = tensor if stream_split and (shape.S + shape.N * shape.T) % tensor == 0 else 1
    per_token = (2 * D / stream + split) * act + 4 * H / tensor  # + the float32 lse
    saved = D / stream * act if remat else per_token
    layer_weights = matmul_params(c) / L * itemsize / tensor  # one layer, gathered over fsdp
    layer = WORKSPACE_ROWS * tokens * D * act + 2 * layer_weights
    if remat:
        layer += tokens * per_token
    rows = tokens / (shape.S + shape.N * shape.T) * shape.N * shape.T
    chunk = min(rows, _HEAD_CHUNK_ROWS)
    vocab = c.vocab_size / tensor
    head = (
        rows * D * (act + 4)  # the final hidden states and their float32 cotangent
        + 2 * vocab * D * itemsize  # the head's block gathered over fsdp, its gradient
        + 2 * chunk * min(vocab, max(128, _HEAD_CHUNK_LOGITS // chunk)) * 4  # logits, their grad
    )
    copies = STATE_COPIES + (FSDP_COPIES if fsdp > 1 else 0)
    state = copies * param_count(c) * itemsize / (fsdp * tensor)
    return UpdateMemory(state, L * tokens * saved, layer, head)


def memory_bound(c: LlamaConfig, shape: Shape, mesh_sizes, microbatches: int, minibatches: int,
                 itemsize: int, remat: bool = False, act_itemsize: int | None = None,
                 hbm_bytes: int | None = None, stream_split: bool = False) -> float:  # fmt: skip
    """An analytic estimate of one chip's peak bytes in an RL step on mesh (data, fsdp,
    tensor): the larger of the update's (update_memory) and the sampler's in the layout
    AUTO picks (sampler_memory, plus the update's arguments that stay allocated beside
    it). For ordering meshes before compiling them: the compiler's peak is the
    measurement."""
    update = update_memory(c, shape, mesh_sizes, microbatches, minibatches, itemsize,
                           act_itemsize, remat, stream_split=stream_split)  # fmt: skip
    resident = 3 * param_count(c) * itemsize / (mesh_sizes[1] * mesh_sizes[2])
    sampler = sampler_memory(c, shape, mesh_sizes, itemsize, act_itemsize, hbm_bytes=hbm_bytes)
    return max(update.total, sum(sampler.values()) + resident)


def sampler_weights(c: LlamaConfig, shape: Shape, mesh_sizes, itemsize: int,
                    act_itemsize: int | None = None,
                    hbm_bytes: int | None = None) -> SamplerWeights:  # fmt: skip
    """SamplerWeights.AUTO's choice, as kjax.sampler_layout.resolve_weights makes it:
    TENSOR where fsdp > 1 and its weights + the K/V cache + the update's arguments fit
    AUTO_SHARE of hbm_bytes, else TRAIN (and TRAIN without a memory figure)."""
    _, fsdp, tensor = mesh_sizes
    if fsdp == 1 or not hbm_bytes:
        return SamplerWeights.TRAIN
    held = param_count(c) * itemsize / tensor
    resident = 3 * param_count(c) * itemsize / (fsdp * tensor)
    cache = _kv_bytes(c, shape, mesh_sizes, act_itemsize or itemsize)
    fits = held + cache + resident <= AUTO_SHARE * hbm_bytes
    return SamplerWeights.TENSOR if fits else SamplerWeights.TRAIN


def _kv_bytes(c: LlamaConfig, shape: Shape, mesh_sizes, act: int) -> float:
    """The sampler's K/V cache per chip (kjax.sharding.cache_spec: heads over tensor, or
    rows over tensor where it does not divide K): the prompt's once per prompt, the own
    slots (T - 1, rounded up on TPU: ignored here) per sample; keys and values."""
    data, fsdp, tensor = mesh_sizes
    L, K, E = c.num_layers, c.num_kv_heads, c.head_dim
    slots = shape.B * shape.S + shape.B * shape.N * max(shape.T - 1, 1)
    return 2 * L * slots * K * E * act / (data * fsdp * tensor)


def sampler_memory(c: LlamaConfig, shape: Shape, mesh_sizes, itemsize: int,
                   act_itemsize: int | None = None, weights: SamplerWeights | None = None,
                   hbm_bytes: int | None = None) -> dict[str, float]:  # fmt: skip
    """A decode step's bytes per chip by term: the weights in the sampler's layout
    (`weights`, default AUTO's choice: sampler_weights), the K/V cache, and the float32
    logits of its rows over V / tensor. Not counted: the update's arguments, which the
    trainer keeps allocated beside the sampler (memory_bound adds them)."""
    data, fsdp, tensor = mesh_sizes
    act = act_itemsize or itemsize
    if weights is None or weights is SamplerWeights.AUTO:
        weights = sampler_weights(c, shape, mesh_sizes, itemsize, act, hbm_bytes)
    split = tensor if weights is SamplerWeights.TENSOR else fsdp * tensor
    rows = shape.B * shape.N / (data * fsdp)
    return {
        "weights": param_count(c) * itemsize / split,
        "kv": _kv_bytes(c, shape, mesh_sizes, act),
        "logits": rows * c.vocab_size / tensor * 4,
    }
