"""kjax's own update and sampler on abstract, sharded inputs, compiled for a mesh of
topology devices: `plan` returns what one chip holds and computes, and the projection."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import sampler_layout, sampling, sharding
from kjax.models.config import LlamaConfig
from kjax.models.llama import Llama
from kjax.rl.components import step_and_sampler
from kjax.rl.config import ModelKind, TrainConfig
from kjax.rl.train_step import RLBatch, TrainState, optimizer_shardings
from kjax.sampler_weights import SamplerWeights
from kjax.scale.chips import Chip, chip_of, topology_devices
from kjax.scale.compiled import Compiled, compile_one
from kjax.scale.costs import (
    Shape,
    attention_density,
    decode_flops,
    splash_attention_cost,
    update_flops,
)


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


def _cache(shape, dtype, mesh):
    """A cache [L, rows, length, K, E] laid out as the sampler lays it (sharding.cache_spec)."""
    return _abstract(shape, dtype, NamedSharding(mesh, sharding.cache_spec(shape, mesh)))


def _tpu(mesh: Mesh) -> bool:
    """Whether `mesh` is of TPU devices (the sampler pads its own K/V cache there)."""
    return mesh.devices.flat[0].platform == "tpu"


def kv_cache_bytes(c: LlamaConfig, shape: Shape, dtype, mesh: Mesh) -> int:
    """Per-chip bytes of the sampler's K/V: the prompt's [L,B,S,K,E] once per prompt and
    each sample's own [L,B*N,T-1,K,E], keys and values, laid out by sharding.cache_spec."""
    L, K, E = c.num_layers, c.num_kv_heads, c.head_dim
    prompt = _cache((L, shape.B, shape.S, K, E), dtype, mesh)
    own = _cache((L, shape.B * shape.N, sampling.own_slots(shape.T, _tpu(mesh)), K, E), dtype, mesh)
    return 2 * per_chip_bytes([prompt, own])


def decode_floor(c: LlamaConfig, shape: Shape, window: int, mesh: Mesh, params,
                 dtype) -> dict[str, int]:  # fmt: skip
    """The HBM bytes one chip must move in one decode step reading `window` own K/V slots,
    by term, with the weights `params` (ShapeDtypeStructs) in the sampler's layout:

    weights: every weight the chip holds, read once (each of its rows meets each), but of
      an untied embedding table only its rows' embeddings;
    prompt_kv: the K and V of its prompts, all S slots (every sample attends to them);
    own_kv: its rows' K and V over the window, and the fed token's K and V written.
    Nothing else is counted (the logits, activations and the draw may stay in on-chip
    memory: on v6e they do), so a compiled step can approach it, not go below it."""
    L, K, E, D = c.num_layers, c.num_kv_heads, c.head_dim, c.hidden_size
    rows = shape.B * shape.N
    weights = 0
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not c.tie_embeddings and getattr(path[0], "key", None) == "embed":
            x = _abstract((rows, D), x.dtype, NamedSharding(mesh, P(sharding.RULES["batch"])))
        weights += per_chip_bytes(x)
    cache = lambda n, length: 2 * per_chip_bytes(_cache((L, n, length, K, E), dtype, mesh))  # noqa: E731
    return {
        "weights": weights,
        "prompt_kv": cache(shape.B, shape.S),
        "own_kv": cache(rows, window) + cache(rows, 1),
    }


class _Stops:
    """The one field of a Task that step_and_sampler reads."""

    def __init__(self, stop_ids):
        self.stop_ids = tuple(stop_ids)


class _AtRows:
    """A PackedStep lowered at a given packed row count R (compile_one calls .lower)."""

    def __init__(self, step, rows: int):
        self.step, self.rows = step, rows

    def lower(self, *args):
        return self.step.lower(*args, rows=self.rows)


def compile_update(cfg: TrainConfig, c: LlamaConfig, mesh: Mesh, state, shape: Shape,
                   rows: int | None = None) -> Compiled:  # fmt: skip
    """The trainer's jitted RL update (step_and_sampler's), compiled for `mesh`; with
    `rows` the packed update at R = rows per group (cfg.rl.pack=GROUP) or per batch shard
    of a microbatch (BATCH)."""
    step_fn, _ = step_and_sampler(cfg, c, mesh, state, _Stops(c.eos_ids))
    batch = abstract_batch(shape.B, shape.N, shape.S, shape.T, mesh)
    ref = state.params if cfg.rl.kl_coef > 0 else None
    k = np.int32(cfg.objective.k)
    # Splash kernels (attention AUTO on a TPU topology) cost their unmasked entries.
    cost = splash_attention_cost(attention_density(shape.S, rows or shape.N, shape.T))
    fn, name = (step_fn, "update") if rows is None else (_AtRows(step_fn, rows), f"update@R{rows}")
    return compile_one(name, fn, state, batch, ref, k, mesh=mesh, kernel_cost=cost)


def compile_prefill(cfg: TrainConfig, c: LlamaConfig, mesh: Mesh, params, shape: Shape):
    """The sampler's prefill (kjax.sampling.prefill: each prompt once), compiled."""
    sh = sharding.batch_sharding(mesh)
    dtype = cfg.model.compute_dtype

    @jax.jit
    def fn(params, prompts, mask):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as the trainer's sampler
            return sampling.prefill(params, c, prompts, mask, dtype)

    prompts = _abstract((shape.B, shape.S), jnp.int32, sh)
    mask = _abstract((shape.B, shape.S), bool, sh)
    cost = splash_attention_cost(attention_density(shape.S))
    return compile_one("prefill", fn, params, prompts, mask, mesh=mesh, kernel_cost=cost)


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
    own = _cache((L, B * N, sampling.own_slots(T, _tpu(mesh)), K, E), dtype, mesh)

    def body(params, prompt, own_k, own_v, fed, step, key, temperature):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as the trainer's sampler
            logits, k, v = sampling._decode_logits(
                params, c, prompt, own_k, own_v, fed, step, window, dtype
            )
            own_k, own_v = sampling.write_own(own_k, own_v, k, v, step, dtype)
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
    return compile_one(f"decode@{window}", fn, *args, mesh=mesh)


def compile_reshard(cfg: TrainConfig, c: LlamaConfig, mesh: Mesh, params,
                    weights: SamplerWeights) -> Compiled | None:  # fmt: skip
    """The sampler's once-per-rollout reshard of the weights from the trainer's layout
    (`params`) to `weights`' (kjax.sampler_layout.sampler_params), compiled on its own;
    None where the layouts are the same (TRAIN)."""
    if weights is not SamplerWeights.TENSOR:
        return None
    rules = sampler_layout.weight_rules(weights)
    target = abstract_params(c, param_dtype(cfg), mesh, rules)
    fn = jax.jit(lambda p: p, out_shardings=jax.tree.map(lambda x: x.sharding, target))
    return compile_one("reshard", fn, params, mesh=mesh)


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
    fn = jax.jit(functools.partial(sampler, n=shape.N))
    return compile_one("sampler", fn, *args, mesh=mesh)


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
    # The sampler's weight layout (SamplerWeights value), its once-per-rollout reshard
    # from the trainer's (None: the same layout), and the decode floor's terms at the two
    # windows (decode_floor).
    weights: str = SamplerWeights.TRAIN.value
    reshard: Compiled | None = None
    decode_floors: tuple[dict, dict] = ({}, {})

    def floor_ratio(self, i: int) -> float:
        """The compiled decode step's HBM bytes over its floor, at window i (0, -1)."""
        return self.decode[i].bytes_accessed / sum(self.decode_floors[i].values())

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
        if self.reshard is not None:
            parts.append(self.reshard.peak_bytes)
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
        programs += [p for p in (self.reshard, self.sampler) if p is not None]
        overflow = any(p.overflow for p in programs)
        return self.peak_bytes <= self.chip.hbm_bytes and not overflow

    @property
    def update_seconds(self) -> float:
        """Projected update time, perfect overlap: max(compute, HBM, ICI)."""
        return self.update.seconds_on(self.chip)

    @property
    def update_serial_seconds(self) -> float:
        """Projected update time, no overlap: compute + HBM + ICI."""
        return self.update.serial_seconds_on(self.chip)

    def _decode_step(self, window: int, serial: bool = False) -> float:
        (a, b), (w1, w2) = self.decode, (self.windows[0][0], self.windows[-1][0])
        f = 0.0 if w2 == w1 else (window - w1) / (w2 - w1)
        terms = [
            x(self.chip) + f * (y(self.chip) - x(self.chip))
            for x, y in (
                (a.compute_seconds, b.compute_seconds),
                (a.hbm_seconds, b.hbm_seconds),
                (a.ici_seconds, b.ici_seconds),
            )
        ]
        return sum(terms) if serial else max(terms)

    def _sampler(self, serial: bool) -> float:
        once = [self.prefill] + ([self.reshard] if self.reshard is not None else [])
        total, start = sum(p.serial_seconds_on(self.chip) if serial else p.seconds_on(self.chip)
                           for p in once), 1  # fmt: skip
        for window, end in self.windows:
            total += (end - start) * self._decode_step(window, serial)
            start = end
        return total

    @property
    def sampler_seconds(self) -> float:
        """The weights' reshard (once per rollout, TENSOR) + prefill + every decode step
        of a sample that runs all T tokens, each step's cost interpolated (linear in the
        window) between the two compiled decode steps; each program at max(compute, HBM,
        ICI)."""
        return self._sampler(serial=False)

    @property
    def step_seconds(self) -> float:
        """Projected RL step: sampler + update (verification and host work not counted),
        each at perfect overlap."""
        return self.sampler_seconds + self.update_seconds

    @property
    def serial_step_seconds(self) -> float:
        """The RL step with no overlap inside any program (compute + HBM + ICI)."""
        return self._sampler(serial=True) + self.update_serial_seconds

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
        """Analytic model FLOPs / (projected update time x peak FLOP/s x chips), overlapped."""
        return self.update_model_flops / (self.update_seconds * self.chip.bf16_flops * self.chips)

    @property
    def update_serial_mfu(self) -> float:
        """update_mfu at the no-overlap time."""
        peak = self.chip.bf16_flops * self.chips
        return self.update_model_flops / (self.update_serial_seconds * peak)


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
    dtype = cfg.model.compute_dtype
    kv_bytes = kv_cache_bytes(c, shape, dtype, mesh)
    held = per_chip_bytes(state.params) + per_chip_bytes(state.opt_state)
    weights = sampler_layout.resolve_weights(
        cfg.sampler_weights, params, c, mesh, cache_bytes=kv_bytes, resident_bytes=held,
        hbm_bytes=chip.hbm_bytes,
    )  # fmt: skip
    cfg = dataclasses.replace(cfg, sampler_weights=weights)  # the sampler's, resolved
    sampler_params = abstract_params(
        c, param_dtype(cfg), mesh, sampler_layout.weight_rules(weights)
    )
    label = f"{topology} mesh {'x'.join(map(str, mesh_sizes))} micro {microbatches}"
    log(f"{label}: compiling the update")
    update = compile_update(cfg, c, mesh, state, shape)
    log(f"{label}: update compiled in {update.seconds:.0f} s; compiling the sampler")
    phases = tuple(sampling._phases(shape.T, sampling.own_slots(shape.T, _tpu(mesh))))
    reshard = compile_reshard(cfg, c, mesh, params, weights)
    prefill = compile_prefill(cfg, c, mesh, sampler_params, shape)
    first = compile_decode(cfg, c, mesh, sampler_params, shape, phases[0][0])
    last = first
    if phases[-1][0] != phases[0][0]:
        last = compile_decode(cfg, c, mesh, sampler_params, shape, phases[-1][0])
    sampler = compile_sampler(cfg, c, mesh, state, shape) if full_sampler else None
    parts = {id(x): x for x in (reshard, prefill, first, last, sampler) if x is not None}
    seconds = sum(x.seconds for x in parts.values())
    log(f"{label}: sampler compiled in {seconds:.0f} s (weights: {weights.value})")
    return Plan(
        topology=topology,
        chip=chip,
        chips=len(devices),
        mesh=tuple(mesh_sizes),
        microbatches=microbatches,
        shape=shape,
        params_bytes=per_chip_bytes(state.params),
        opt_bytes=per_chip_bytes(state.opt_state),
        kv_bytes=kv_bytes,
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
        weights=weights.value,
        reshard=reshard,
        decode_floors=tuple(
            decode_floor(c, shape, w, mesh, sampler_params, dtype)
            for w in (phases[0][0], phases[-1][0])
        ),
    )
