"""A calibration of the planner's projection against a measured figure: kjax's own
Llama-3.1-8B in MaxText's published pre-training configuration, compiled for a small v6e
slice with the same machinery as the RL update, its projected tokens/s/chip and MFU set
beside MaxText's measured ones.

MaxText measured (its published model-tiering table and the llama3_1_8b_8192 entry of its
Trillium benchmark configurations, AI-Hypercomputer's MaxText repository at e591f30):
Llama-3.1-8B on v6e-256, bfloat16, sequence 8192, per-device batch 4, 7,207 tokens/s/chip,
45.46% MFU; its tokens/s/chip is flat (7.0-7.2k) across v6e slices of 8 to 256 chips, so
a small slice stands in for the pod. MaxText's MFU counts 6 x (layer matmul params + the
head) FLOPs per token plus 12 x S x H x E x L for attention (causal masking not halved):
5.79e10 per token for the 8B at S = 8192, which with 7,207 tokens/s/chip on 918 TFLOP/s
is its 45.46% (`maxtext_flops_per_token`). kjax's projected MFU uses the same count.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from kjax import sharding
from kjax.models import attention, llama
from kjax.models.config import AttentionBackend, LlamaConfig
from kjax.rl import forward, losses
from kjax.scale.chips import Chip, chip_of, topology_devices
from kjax.scale.compiled import Compiled, compile_one
from kjax.scale.costs import matmul_params, splash_attention_cost
from kjax.scale.planner import abstract_params, abstract_state


@dataclasses.dataclass(frozen=True)
class Measured:
    """A published measurement to calibrate against."""

    tokens_per_s_per_chip: float
    mfu: float
    seq: int
    per_device_batch: int
    source: str


MAXTEXT_LLAMA31_8B_V6E = Measured(
    tokens_per_s_per_chip=7207.0,
    mfu=0.4546,
    seq=8192,
    per_device_batch=4,
    source="MaxText's model-tiering table and Trillium benchmark configs "
    "(Llama-3.1-8B, v6e-256, bf16)",
)


def maxtext_flops_per_token(c: LlamaConfig, seq: int) -> float:
    """Training FLOPs per token as MaxText counts them for its MFU: 6 x (the layers'
    matmul params + the head's D x V) + 12 x seq x H x E x L (attention, unmasked)."""
    dense = 6 * (matmul_params(c) + c.hidden_size * c.vocab_size)
    return dense + 12 * seq * c.num_heads * c.head_dim * c.num_layers


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The pre-training step compiled for a slice, its projection and the measurement."""

    topology: str
    chip: Chip
    chips: int
    mesh: tuple[int, int, int]
    per_device_batch: int
    seq: int
    remat: bool
    step: Compiled
    flops_per_token: float
    measured: Measured

    @property
    def tokens_per_step_per_chip(self) -> int:
        return self.per_device_batch * self.seq

    def tokens_per_s_per_chip(self, serial: bool = False) -> float:
        """Projected: tokens per chip / the step's time, overlapped (max of compute, HBM,
        ICI) or with no overlap (their sum)."""
        t = self.step.serial_seconds_on(self.chip) if serial else self.step.seconds_on(self.chip)
        return self.tokens_per_step_per_chip / t

    def mfu(self, serial: bool = False) -> float:
        """Projected MFU in MaxText's FLOP count."""
        return self.tokens_per_s_per_chip(serial) * self.flops_per_token / self.chip.bf16_flops

    def ratio(self, serial: bool = False) -> float:
        """Projected / measured tokens/s/chip (the same ratio for MFU: one FLOP count)."""
        return self.tokens_per_s_per_chip(serial) / self.measured.tokens_per_s_per_chip


def _causal_hidden(params, c: LlamaConfig, tokens, backend, dtype, remat: bool):
    """Final hidden states [B,S,D] of full rows (no padding) with attention through
    `backend` (kjax.models.attention: the causal case, n*t = 0, as the sampler's prefill)."""
    B, S = tokens.shape
    everywhere = jnp.ones((B, S), bool)
    cos, sin = llama.rope_tables(c, llama.default_positions(everywhere))

    def block(x, inputs):
        layer, _ = inputs
        q, k, v = llama.layer_qkv(layer, c, x, cos, sin)
        out = attention.grouped_attention(backend, q, k, v, everywhere, 0, 0)
        return sharding.constrain_batch(llama.layer_out(layer, c, x, out)), None

    x0 = sharding.constrain_batch(llama.embed(params, tokens, dtype))
    return llama.scan_layers(block, x0, (params["layers"], llama.layer_windows(c)), remat=remat)


def pretrain_loss(params, tokens, targets, *, c: LlamaConfig, dtype, remat: bool):
    """Mean next-token cross-entropy of targets [B,S] given tokens [B,S] (full rows)."""
    backend = attention.resolve(c, dtype, tokens.shape[1])
    if backend is AttentionBackend.JNP:  # the reference: [B,S,V] logits, [S,S] mask
        logits = llama.forward(params, c, tokens, dtype=dtype, remat=remat)
        return losses.cross_entropy_loss(logits, targets, jnp.ones(targets.shape, bool))[0]
    # Through the kernel (attention.resolve: splash on TPU from 512 positions): causal
    # attention with no [S,S] mask, and the loss from the chunked head, never [B,S,V].
    hidden = _causal_hidden(params, c, tokens, backend, dtype, remat)
    return -forward.chunked_token_stats(params, c, hidden, targets).logprobs.mean()


def kernel_cost(c: LlamaConfig, seq: int = MAXTEXT_LLAMA31_8B_V6E.seq):
    """The `kernel_cost` hook for the step's splash kernels: FLOPs over the score blocks a
    causal mask leaves (n (n + 1) / 2 of n^2 blocks of attention's block size)."""
    n = -(-seq // attention.BLOCK)
    return splash_attention_cost(n * (n + 1) / 2 / n**2)


def pretrain_step(c: LlamaConfig, optimizer, dtype, remat: bool, mesh):
    """step(state, tokens [B,S] int32, targets [B,S] int32) -> state: next-token
    cross-entropy on every position, Adam; the whole TrainState donated."""

    loss_fn = functools.partial(pretrain_loss, c=c, dtype=dtype, remat=remat)

    def step(state, tokens, targets):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as kjax.rl traces
            grads = jax.grad(loss_fn)(state.params, tokens, targets)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return state._replace(params=params, opt_state=opt_state, step=state.step + 1)

    return jax.jit(step, donate_argnums=(0,))


def calibrate(
    c: LlamaConfig,
    topology: str,
    *,
    measured: Measured = MAXTEXT_LLAMA31_8B_V6E,
    mesh_sizes=None,
    remat: bool = True,
    dtype=jnp.bfloat16,
    devices=None,
    kernel_cost=None,
    log: Callable[[str], None] = lambda _: None,
) -> Calibration:
    """Compiles the pre-training step of `c` (the attention backend is whatever `c`
    selects) at `measured`'s sequence and per-device batch for `topology`, every chip on
    fsdp by default (data, fsdp, tensor = 1, chips, 1), params and Adam moments in
    `dtype` as kjax's presets keep them; returns its projection beside `measured`."""
    devices = topology_devices(topology) if devices is None else devices
    chips = len(devices)
    mesh_sizes = tuple(mesh_sizes or (1, chips, 1))
    mesh = sharding.make_mesh(*mesh_sizes, devices=devices)
    optimizer = optax.adam(1e-5)
    params = abstract_params(c, dtype, mesh)
    state = abstract_state(params, optimizer, mesh)
    B, S = measured.per_device_batch * chips, measured.seq
    batch = jax.ShapeDtypeStruct((B, S), jnp.int32, sharding=sharding.batch_sharding(mesh))
    log(f"calibration: compiling the pre-training step for {topology} (B={B}, S={S})")
    start = time.perf_counter()
    step = compile_one(
        "pretrain",
        pretrain_step(c, optimizer, dtype, remat, mesh),
        state,
        batch,
        batch,
        mesh=mesh,
        kernel_cost=kernel_cost,
    )
    log(f"calibration: compiled in {time.perf_counter() - start:.0f} s")
    return Calibration(
        topology=topology,
        chip=chip_of(topology),
        chips=chips,
        mesh=mesh_sizes,
        per_device_batch=measured.per_device_batch,
        seq=S,
        remat=remat,
        step=step,
        flops_per_token=maxtext_flops_per_token(c, S),
        measured=measured,
    )
