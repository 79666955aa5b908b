"""kjax's RL update and grouped sampler compiled for a TPU pod without one (compile only).

`compile_plan(cfg, model_config, devices, mesh_sizes)` builds the trainer's own jitted
update (kjax.rl.components.step_and_sampler: loss_fn, optimizer, PPO epochs and
microbatches as configured) and its sampler (prefill once, one decode step with the KV
cache) from jax.ShapeDtypeStructs with kjax's NamedShardings on a mesh of `devices`, e.g.
`topology_devices("v5p:4x4x4")` (jax.experimental.topologies; needs libtpu, `.[tpu]`),
compiles them and reads what one chip holds and computes from the compiler itself
(memory_analysis, cost_analysis, the collectives of the HLO). Nothing is allocated.

Every figure is *compiled, not run*: times are a roofline projection,
max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) per chip, from the CHIPS specs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import hlo_stats, sampling, sharding
from kjax.models.config import LlamaConfig
from kjax.models.llama import Llama
from kjax.rl.components import step_and_sampler
from kjax.rl.config import ModelKind, TrainConfig
from kjax.rl.train_step import RLBatch, TrainState, optimizer_shardings

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip's public specs (per chip, dense bf16)."""

    name: str
    hbm_bytes: int
    bf16_flops: float  # peak FLOP/s
    hbm_bandwidth: float  # bytes/s
    source: str


CHIPS = {
    "v4": Chip("TPU v4", 32 * GiB, 275e12, 1228e9, "cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", 16 * GiB, 197e12, 819e9, "cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", 95 * GiB, 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", 32 * GiB, 918e12, 1640e9, "cloud.google.com/tpu/docs/v6e"),
    # GPUs compile through the CUDA plugin (jax-cuda12-plugin) from _H100_TARGET, no GPU.
    "h100": Chip("NVIDIA H100 SXM", 84929347584, 989e12, 3350e9, "nvidia.com H100 datasheet"),
}
# XLA's GpuTargetConfigProto of an H100 SXM (xla/tools/hlo_opt/gpu_specs, as in
# github.com/jax-ml/jax/issues/28376), for compiling without one.
_H100_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84929347584 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def chip_of(topology: str) -> Chip:
    """The Chip of a topology name such as "v5p:4x4x4"."""
    kind = topology.partition(":")[0]
    if kind not in CHIPS:
        raise ValueError(f"topology {topology!r}: unknown chip {kind!r}; known: {sorted(CHIPS)}")
    return CHIPS[kind]


def topology_chips(topology: str) -> int:
    """Chips of a topology name: "v5p:4x4x4" -> 64."""
    dims = topology.partition(":")[2]
    if not re.fullmatch(r"\d+(x\d+)*", dims):
        raise ValueError(f"topology {topology!r} must look like v5p:4x4x4 or v5e:16x16")
    return math.prod(int(d) for d in dims.split("x"))


def libtpu_missing(topology: str = "v5e") -> str | None:
    """Why `topology` cannot be compiled for here (None when its compiler is importable:
    libtpu for a TPU, the CUDA plugin for an h100)."""
    import importlib.util

    if topology.partition(":")[0] == "h100":
        if importlib.util.find_spec("jax_cuda12_plugin") is None:
            return "the CUDA plugin is not installed (pip install jax-cuda12-plugin)"
        return None
    if importlib.util.find_spec("libtpu") is None:
        return "libtpu is not installed (pip install -e '.[tpu]')"
    return None


def topology_devices(topology: str):
    """The compile-only devices of a TPU topology ("v5p:4x4x4" -> 64 TPU v5 devices) or of
    n H100s ("h100:8")."""
    from jax.experimental import topologies

    chip_of(topology)
    why = libtpu_missing(topology)
    if why:
        raise RuntimeError(f"cannot compile for {topology}: {why}")
    if topology.startswith("h100:"):
        n = topology_chips(topology)
        desc = topologies.get_topology_desc(
            platform="cuda", target_config=_H100_TARGET, topology=f"1x1x{n}"
        )
        return desc.devices
    # Outside a TPU VM libtpu asks the metadata server for these; say them instead. With
    # no TPU to guard, several processes may compile at once (libtpu's lockfile is for
    # processes sharing a real chip).
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices


# ----------------------------------------------------------------------------- abstract


def param_dtype(cfg: TrainConfig):
    """The params' storage dtype as the trainer builds them (TINY: float32; loaded
    weights: the compute dtype, kjax.models.load's default)."""
    return jnp.float32 if cfg.model.kind is ModelKind.TINY else cfg.model.compute_dtype


def _abstract(shape, dtype, sh):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)


def abstract_params(model_config: LlamaConfig, dtype, mesh: Mesh, rules=sharding.RULES):
    """The params dict (kjax.models.llama layout) as ShapeDtypeStructs with kjax's
    shardings (sharding.shardings_for), no array allocated."""
    model = nnx.eval_shape(lambda: Llama(model_config, rngs=nnx.Rngs(0), param_dtype=dtype))
    state = nnx.state(model, nnx.Param)
    shardings = nnx.to_pure_dict(sharding.shardings_for(state, mesh, rules))
    shapes = nnx.to_pure_dict(state)
    return jax.tree.map(lambda s, sh: _abstract(s.shape, s.dtype, sh), shapes, shardings)


def abstract_state(params, optimizer: optax.GradientTransformation, mesh: Mesh) -> TrainState:
    """A TrainState of ShapeDtypeStructs laid out as init_train_state lays it out (the
    optimizer state by train_step.optimizer_shardings), scalars replicated."""
    replicated = NamedSharding(mesh, P())
    opt = jax.tree.map(
        lambda s, sh: _abstract(s.shape, s.dtype, sh),
        jax.eval_shape(optimizer.init, params),
        optimizer_shardings(optimizer, params, mesh),
    )
    return TrainState(
        params,
        opt,
        _abstract((), jnp.int32, replicated),
        _abstract((2,), jnp.uint32, replicated),
    )


def abstract_batch(B: int, N: int, S: int, T: int, mesh: Mesh) -> RLBatch:
    """An RLBatch of ShapeDtypeStructs, B over the batch rule's mesh axes."""
    sh = sharding.batch_sharding(mesh)
    a = lambda shape, dtype: _abstract(shape, dtype, sh)  # noqa: E731
    return RLBatch(
        a((B, S), jnp.int32),
        a((B, S), bool),
        a((B, N, T), jnp.int32),
        a((B, N, T), bool),
        a((B, N, T), jnp.float32),
        a((B, N), jnp.float32),
        a((B, N), jnp.float32),
    )


def per_chip_bytes(tree) -> int:
    """Bytes one chip holds of a pytree of sharded ShapeDtypeStructs (the largest shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape)
        total += math.prod(shard) * jnp.dtype(x.dtype).itemsize
    return total


# ----------------------------------------------------------------------------- compiled

UNBOUNDED_HBM_MIB = 1 << 24  # 16 TiB: what a chip would need, when it is more than it has


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the TPU compiler reports for one program on one chip."""

    name: str
    seconds: float  # lower + compile wall time
    flops: float  # loops counted per trip (kjax.hlo_stats)
    bytes_accessed: float  # HBM traffic, loops counted per trip (kjax.hlo_stats)
    xla_flops: float  # cost_analysis(): every loop body counted once
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    collectives: dict[str, tuple[int, int]]
    unbounded_loops: int
    overflow: str | None = None  # the compiler's out-of-memory message, if it gave one

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs not aliased to (donated) arguments + temporaries + code."""
        return (
            self.argument_bytes
            + self.output_bytes
            - self.alias_bytes
            + self.temp_bytes
            + self.code_bytes
        )

    def seconds_on(self, chip: Chip) -> float:
        """Roofline time: max(FLOPs / peak FLOP/s, bytes accessed / HBM bandwidth)."""
        return max(self.flops / chip.bf16_flops, self.bytes_accessed / chip.hbm_bandwidth)


def largest_buffers(hlo_text: str, k: int = 3) -> list[tuple[int, str, str]]:
    """The k largest distinct arrays a compiled module holds per chip: (bytes, type,
    op_name), read from the results of every instruction outside fusions (a while loop's
    carried tuple by element), so that an out-of-memory answer can name its tensors. Arrays
    of one type are listed once (a K and a V cache of one shape share a line)."""
    comps, _, _ = hlo_stats._parse(hlo_text)
    inside = {
        c
        for instrs in comps.values()
        for i in instrs
        if i.op == "fusion"
        for c in re.findall(r"calls=%([\w.\-]+)", i.attrs)
    }
    found: dict[str, tuple[int, str]] = {}
    for comp, instrs in comps.items():
        if comp in inside:
            continue
        for i in instrs:
            m = re.search(r'op_name="([^"]*)"', i.attrs)
            where = "/".join(m.group(1).split("/")[-3:]) if m else ""
            for dtype, dims in hlo_stats._arrays(i.type):
                key = f"{dtype}[{','.join(map(str, dims))}]"
                size = math.prod(dims) * hlo_stats._BITS[dtype] // 8
                if key not in found or (where and not found[key][1]):
                    found[key] = size, where
    top = sorted(found.items(), key=lambda kv: -kv[1][0])[:k]
    return [(size, key, where) for key, (size, where) in top]


def compile_one(name: str, fn, *args) -> Compiled:
    """Lowers and compiles jitted `fn` for abstract `args`; reads the compiler's analyses.

    A program that does not fit the chip's HBM is compiled again against a pretend HBM of
    UNBOUNDED_HBM_MIB, so that its memory_analysis says by how much (`overflow`)."""
    start = time.perf_counter()
    lowered = fn.lower(*args)
    overflow = None
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        overflow = str(e).strip().splitlines()[0]
        try:
            compiled = lowered.compile({"xla_tpu_no_crash_on_oom": True})
        except jax.errors.JaxRuntimeError as again:  # seen on v5e: "Invalid TPU program."
            raise ValueError(
                f"{name}: {overflow} Compiled again past HBM to measure it, the compiler "
                f"answered: {str(again).strip().splitlines()[0]}"
            ) from again
        overflow += " Largest buffers per chip: " + "; ".join(
            f"{key} {size / (1 << 30):.2f} GiB ({where or 'no op_name'})"
            for size, key, where in largest_buffers(compiled.as_text())
        )
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}  # None on a GPU target
    mem = compiled.memory_analysis()
    stats = hlo_stats.module_stats(compiled.as_text())
    return Compiled(
        name=name,
        seconds=seconds,
        flops=stats.flops,
        bytes_accessed=stats.bytes,
        xla_flops=float(cost.get("flops", 0.0)),
        argument_bytes=mem.argument_size_in_bytes,
        output_bytes=mem.output_size_in_bytes,
        alias_bytes=mem.alias_size_in_bytes,
        temp_bytes=mem.temp_size_in_bytes,
        code_bytes=mem.generated_code_size_in_bytes,
        collectives=stats.collectives,
        unbounded_loops=stats.unbounded_loops,
        overflow=overflow,
    )


# ----------------------------------------------------------------------------- the plan


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


def _cache(shape, dtype, mesh):
    """A cache [L, rows, length, K, E] laid out as the sampler lays it (sharding.cache_spec)."""
    return _abstract(shape, dtype, NamedSharding(mesh, sharding.cache_spec(shape, mesh)))


def kv_cache_bytes(c: LlamaConfig, shape: Shape, dtype, mesh: Mesh) -> int:
    """Per-chip bytes of the sampler's K/V: the prompt's [L,B,S,K,E] once per prompt and
    each sample's own [L,B*N,T-1,K,E], keys and values, laid out by sharding.cache_spec."""
    L, K, E = c.num_layers, c.num_kv_heads, c.head_dim
    prompt = _cache((L, shape.B, shape.S, K, E), dtype, mesh)
    own = _cache((L, shape.B * shape.N, max(shape.T - 1, 1), K, E), dtype, mesh)
    return 2 * per_chip_bytes([prompt, own])


class _Stops:
    """The one field of a Task that step_and_sampler reads."""

    def __init__(self, stop_ids):
        self.stop_ids = tuple(stop_ids)


def compile_update(cfg: TrainConfig, c: LlamaConfig, mesh: Mesh, state, shape: Shape) -> Compiled:
    """The trainer's jitted RL update (step_and_sampler's), compiled for `mesh`."""
    step_fn, _ = step_and_sampler(cfg, c, mesh, state, _Stops(c.eos_ids))
    batch = abstract_batch(shape.B, shape.N, shape.S, shape.T, mesh)
    ref = state.params if cfg.rl.kl_coef > 0 else None
    return compile_one("update", step_fn, state, batch, ref, np.int32(cfg.objective.k))


def compile_prefill(cfg: TrainConfig, c: LlamaConfig, mesh: Mesh, params, shape: Shape):
    """The sampler's prefill (kjax.sampling.prefill: each prompt once), compiled."""
    sh = sharding.batch_sharding(mesh)
    dtype = cfg.model.compute_dtype

    @jax.jit
    def fn(params, prompts, mask):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as the trainer's sampler
            return sampling.prefill(params, c, prompts, mask, dtype)

    prompts = _abstract((shape.B, shape.S), jnp.int32, sh)
    return compile_one("prefill", fn, params, prompts, _abstract((shape.B, shape.S), bool, sh))


def compile_decode(cfg: TrainConfig, c: LlamaConfig, mesh: Mesh, params, shape: Shape,
                   window: int) -> Compiled:  # fmt: skip
    """One step of the sampler's decode loop (its while-loop body: kjax.sampling's
    _decode_logits, the cache write and the draw) reading `window` own K/V slots."""
    dtype = cfg.model.compute_dtype
    B, N, S, T = shape.B, shape.N, shape.S, shape.T
    L, K, E = c.num_layers, c.num_kv_heads, c.head_dim
    sh = sharding.batch_sharding(mesh)
    replicated = NamedSharding(mesh, P())
    prompt = sampling.PromptCache(
        _cache((L, B, S, K, E), dtype, mesh),
        _cache((L, B, S, K, E), dtype, mesh),
        _abstract((B, S), bool, sh),
        _abstract((B,), jnp.int32, sh),
    )
    own = _cache((L, B * N, max(T - 1, 1), K, E), dtype, mesh)

    def body(params, prompt, own_k, own_v, fed, step, key, temperature):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as the trainer's sampler
            logits, k, v = sampling._decode_logits(
                params, c, prompt, own_k, own_v, fed, step, window, dtype
            )
            at = (0, 0, step - 1, 0, 0)
            own_k = jax.lax.dynamic_update_slice(own_k, k.astype(dtype), at)
            own_v = jax.lax.dynamic_update_slice(own_v, v.astype(dtype), at)
            own_k, own_v = (sharding.constrain_cache(a) for a in (own_k, own_v))
            drawn = sampling._choose(logits, key, temperature, 0, 1.0, False)
        return own_k, own_v, drawn

    key = jax.eval_shape(lambda: jax.random.key(0))
    args = (
        params,
        prompt,
        own,
        own,
        _abstract((B, N), jnp.int32, sh),
        _abstract((), jnp.int32, replicated),
        _abstract(key.shape, key.dtype, replicated),
        _abstract((), jnp.float32, replicated),
    )
    # The cache leaves laid out as it came (donated, updated in place), as in the loop.
    rows = NamedSharding(mesh, P(sharding.RULES["batch"]))
    out = (own.sharding, own.sharding, (rows, rows, rows))
    fn = jax.jit(body, donate_argnums=(2, 3), out_shardings=out)
    return compile_one(f"decode@{window}", fn, *args)


def compile_sampler(cfg: TrainConfig, c: LlamaConfig, mesh: Mesh, state, shape: Shape):
    """The trainer's whole grouped sampler (step_and_sampler's: prefill, every decode
    phase), compiled: its memory is the sampler's real peak."""
    _, sampler = step_and_sampler(cfg, c, mesh, state, _Stops(c.eos_ids))
    sh = sharding.batch_sharding(mesh)
    replicated = NamedSharding(mesh, P())
    key = jax.eval_shape(lambda: jax.random.key(0))
    args = (
        state.params,
        _abstract((shape.B, shape.S), jnp.int32, sh),
        _abstract((shape.B, shape.S), bool, sh),
        _abstract(key.shape, key.dtype, replicated),
        _abstract((), jnp.float32, replicated),
    )
    return compile_one("sampler", jax.jit(functools.partial(sampler, n=shape.N)), *args)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One (topology, mesh, microbatches) compiled: per-chip bytes, FLOPs, projection."""

    topology: str
    chip: Chip
    chips: int
    mesh: tuple[int, int, int]  # data, fsdp, tensor
    microbatches: int
    shape: Shape
    params_bytes: int
    opt_bytes: int
    kv_bytes: int
    update: Compiled
    prefill: Compiled
    decode: tuple[Compiled, Compiled]  # at the first and at the last own-K/V window
    windows: tuple[tuple[int, int], ...]  # sampling's decode phases (window, end step)
    sampler: Compiled | None
    update_model_flops: float  # all chips
    decode_model_flops: tuple[float, float]  # all chips, at the two windows

    @property
    def grads_bytes(self) -> int:
        """Gradients: one params-shaped tree (the accumulator), same dtype and layout."""
        return self.params_bytes

    @property
    def sampler_peak(self) -> int:
        """The sampler's peak: the largest of the whole sampler's (when compiled), the
        prefill's and the decode steps' (a decode step that overflows HBM on its own
        overflows inside the whole sampler too, whatever its memory analysis says)."""
        parts = [self.prefill.peak_bytes, *(d.peak_bytes for d in self.decode)]
        if self.sampler is not None:
            parts.append(self.sampler.peak_bytes)
        return max(parts)

    @property
    def peak_bytes(self) -> int:
        return max(self.update.peak_bytes, self.sampler_peak)

    @property
    def fits(self) -> bool:
        """Every program's peak within HBM, and none the compiler refused for memory."""
        programs = [self.update, self.prefill, *self.decode]
        if self.sampler is not None:
            programs.append(self.sampler)
        overflow = any(p.overflow for p in programs)
        return self.peak_bytes <= self.chip.hbm_bytes and not overflow

    @property
    def update_seconds(self) -> float:
        return self.update.seconds_on(self.chip)

    def _decode_step(self, window: int) -> float:
        (a, b), (w1, w2) = self.decode, (self.windows[0][0], self.windows[-1][0])
        f = 0.0 if w2 == w1 else (window - w1) / (w2 - w1)
        flops = a.flops + f * (b.flops - a.flops)
        traffic = a.bytes_accessed + f * (b.bytes_accessed - a.bytes_accessed)
        return max(flops / self.chip.bf16_flops, traffic / self.chip.hbm_bandwidth)

    @property
    def sampler_seconds(self) -> float:
        """Prefill + every decode step of a sample that runs all T tokens, each step's cost
        interpolated (linear in the window) between the two compiled decode steps."""
        total, start = self.prefill.seconds_on(self.chip), 1
        for window, end in self.windows:
            total += (end - start) * self._decode_step(window)
            start = end
        return total

    @property
    def step_seconds(self) -> float:
        """Projected RL step: sampler + update (verification and host work not counted)."""
        return self.sampler_seconds + self.update_seconds

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Prompt + completion tokens of the step's B x N sequences, per second per chip."""
        s = self.shape
        return s.B * s.N * (s.S + s.T) / self.step_seconds / self.chips

    @property
    def update_flops_ratio(self) -> float:
        """Compiled update FLOPs per chip / analytic model FLOPs per chip."""
        return self.update.flops / (self.update_model_flops / self.chips)

    @property
    def update_mfu(self) -> float:
        """Analytic model FLOPs / (projected update time x peak FLOP/s x chips)."""
        return self.update_model_flops / (self.update_seconds * self.chip.bf16_flops * self.chips)


def plan(cfg: TrainConfig, c: LlamaConfig, topology: str, mesh_sizes, microbatches: int,
         *, devices=None, full_sampler: bool = False,
         log: Callable[[str], None] = lambda _: None) -> Plan:  # fmt: skip
    """Compiles the update (with `microbatches`) and the sampler for one mesh of
    `topology` (data, fsdp, tensor = mesh_sizes) and returns the Plan."""
    devices = topology_devices(topology) if devices is None else devices
    chip = chip_of(topology)
    mesh = sharding.make_mesh(*mesh_sizes, devices=devices)
    shape = Shape.of(cfg)
    rl = dataclasses.replace(cfg.rl, microbatches=microbatches)
    cfg = dataclasses.replace(cfg, rl=rl)
    parts = rl.minibatches * microbatches * mesh_sizes[0] * mesh_sizes[1]
    if shape.B % parts:
        raise ValueError(
            f"B={shape.B} prompts do not split into minibatches x microbatches x data x fsdp "
            f"= {parts}"
        )
    from kjax.rl.optim import make_optimizer

    params = abstract_params(c, param_dtype(cfg), mesh)
    state = abstract_state(params, make_optimizer(cfg.optimizer), mesh)
    label = f"{topology} mesh {'x'.join(map(str, mesh_sizes))} micro {microbatches}"
    log(f"{label}: compiling the update")
    update = compile_update(cfg, c, mesh, state, shape)
    log(f"{label}: update compiled in {update.seconds:.0f} s; compiling the sampler")
    phases = tuple(sampling._phases(shape.T))
    prefill = compile_prefill(cfg, c, mesh, params, shape)
    first = compile_decode(cfg, c, mesh, params, shape, phases[0][0])
    last = first
    if phases[-1][0] != phases[0][0]:
        last = compile_decode(cfg, c, mesh, params, shape, phases[-1][0])
    sampler = compile_sampler(cfg, c, mesh, state, shape) if full_sampler else None
    parts = {id(x): x for x in (prefill, first, last, sampler) if x is not None}
    seconds = sum(x.seconds for x in parts.values())
    log(f"{label}: sampler compiled in {seconds:.0f} s")
    dtype = cfg.model.compute_dtype
    return Plan(
        topology=topology,
        chip=chip,
        chips=len(devices),
        mesh=tuple(mesh_sizes),
        microbatches=microbatches,
        shape=shape,
        params_bytes=per_chip_bytes(state.params),
        opt_bytes=per_chip_bytes(state.opt_state),
        kv_bytes=kv_cache_bytes(c, shape, dtype, mesh),
        update=update,
        prefill=prefill,
        decode=(first, last),
        windows=phases,
        sampler=sampler,
        update_model_flops=update_flops(c, cfg, shape),
        decode_model_flops=(
            decode_flops(c, shape, phases[0][0]),
            decode_flops(c, shape, phases[-1][0]),
        ),
    )


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
