"""The RL step on real tokens: a static Plan's mesh compiled again as kjax runs a step
whose completions have a length distribution (kjax.scale.lengths): the packed update
(rl.pack=GROUP, R rows per group; or BATCH, R rows per batch shard of each microbatch,
kjax.rl.batch_packing) at the rows R those lengths need, and the compacting sampler's
decode step at the smaller live batch sizes. Every figure compiled, not run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from kjax import sampler_layout, sampling, sharding
from kjax.models.config import LlamaConfig
from kjax.rl import batch_packing
from kjax.rl.config import TrainConfig
from kjax.rl.step_config import PackMode
from kjax.sampler_weights import SamplerWeights
from kjax.scale import lengths as L
from kjax.scale.compiled import Compiled
from kjax.scale.costs import Shape, forward_flops
from kjax.scale.planner import (
    Plan,
    abstract_params,
    abstract_state,
    compile_decode,
    compile_update,
    param_dtype,
)


@dataclasses.dataclass(frozen=True)
class RealPlan:
    """A static Plan and the same mesh's step on real tokens."""

    static: Plan
    lengths: L.Lengths
    mean_tokens: float  # mean completion length of the step's B x N lengths
    longest: int
    rows_needed: int  # packed rows the fullest group needs (first-fit decreasing)
    rows_mean: float  # packed rows the groups need on average (what sets nothing: R is static)
    rows: int  # R compiled: the packing bucket >= rows_needed
    update: Compiled  # the packed update at R
    sizes: tuple[int, ...]  # the compacting sampler's batch sizes
    compact: tuple[tuple[int, Compiled], ...]  # compacted decode steps at the last window
    schedule: tuple[tuple[int, int, int], ...]  # (rows, window, steps)
    static_schedule: tuple[tuple[int, int, int], ...]  # the static sampler on these lengths
    update_model_flops: float  # the packed update's analytic FLOPs (R rows of T), all chips
    real_model_flops: float  # the update's analytic FLOPs on the real tokens, all chips
    real_tokens: float  # prompt + completion tokens of the step's B x N samples
    pack: str = "group"  # rl.pack of the packed update: "group" or "batch"
    rows_of: int = 0  # what R counts out of: N per group (GROUP), G*N per shard (BATCH)
    total_rows: int = 0  # completion rows the update runs over the batch (B R; M P R)

    @property
    def chip(self):
        return self.static.chip

    def _terms(self, x: Compiled):
        return (x.compute_seconds(self.chip), x.hbm_seconds(self.chip), x.ici_seconds(self.chip))

    def step_terms(self, rows: int, window: int) -> L.Terms:
        p = self.static
        return L.compacted_step(
            rows, window, full_rows=p.shape.B * p.shape.N,
            static=(self._terms(p.decode[0]), self._terms(p.decode[1])),
            windows=(p.windows[0][0], p.windows[-1][0]),
            compact=[(r, self._terms(x)) for r, x in self.compact],
        )  # fmt: skip

    def sampler_seconds(self, serial: bool = False, schedule=None) -> float:
        """Prefill, the decode steps of `schedule` (default: the compacting sampler's), and
        the weights' reshard to the sampler's layout, once per rollout as the static plan
        counts it (every compacted step reads the weights in that layout)."""
        steps = list(schedule or self.schedule)
        total = L.sampler_seconds(self._terms(self.static.prefill), steps, self.step_terms, serial)
        once = self.static.reshard
        if once is not None:
            total += once.serial_seconds_on(self.chip) if serial else once.seconds_on(self.chip)
        return total

    @property
    def update_seconds(self) -> float:
        return self.update.seconds_on(self.chip)

    @property
    def step_seconds(self) -> float:
        return self.sampler_seconds() + self.update_seconds

    @property
    def serial_step_seconds(self) -> float:
        return self.sampler_seconds(serial=True) + self.update.serial_seconds_on(self.chip)

    def _per_chip(self, seconds: float) -> float:
        return self.real_tokens / seconds / self.static.chips

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Real tokens per second per chip, packed update + compacting sampler."""
        return self._per_chip(self.step_seconds)

    @property
    def static_tokens_per_s_per_chip(self) -> float:
        """The static plan's step (padded update, every sample run to T) on real tokens."""
        return self._per_chip(self.static.step_seconds)

    @property
    def speedup(self) -> float:
        return self.static.step_seconds / self.step_seconds

    def _mfu(self, flops: float, seconds: float) -> float:
        return flops / (seconds * self.chip.bf16_flops * self.static.chips)

    @property
    def update_mfu(self) -> float:
        """Real-token FLOPs over the packed update's projected time (overlapped)."""
        return self._mfu(self.real_model_flops, self.update_seconds)

    @property
    def update_serial_mfu(self) -> float:
        return self._mfu(self.real_model_flops, self.update.serial_seconds_on(self.chip))

    @property
    def static_update_mfu(self) -> float:
        """Real-token FLOPs over the padded update's projected time (overlapped)."""
        return self._mfu(self.real_model_flops, self.static.update_seconds)

    @property
    def update_flops_ratio(self) -> float:
        return self.update.flops / (self.update_model_flops / self.static.chips)

    @property
    def peak_bytes(self) -> int:
        """The programs this step runs: the packed update, the prefill and full-batch
        decode steps (the compacting sampler starts at B N rows), the compacted steps. The
        padded update is not among them."""
        return max(self.update.peak_bytes, self.static.sampler_peak,
                   *(x.peak_bytes for _, x in self.compact))  # fmt: skip

    @property
    def fits(self) -> bool:
        programs = [self.update, self.static.prefill, *self.static.decode]
        overflow = any(x.overflow for x in programs + [x for _, x in self.compact])
        return self.peak_bytes <= self.chip.hbm_bytes and not overflow


def compact_floor(cfg: TrainConfig) -> int:
    """The compacting sampler's floor the projection uses: the config's, else 1 (compact
    down to the smallest size the batch shards allow)."""
    return cfg.sampler_compact_floor or 1


def batch_rows(used, chunks: int, groups: int, n: int, shards: int) -> tuple[int, int, int]:
    """rl.pack=BATCH's (rows needed, R, total rows) for groups needing used [B] rows each,
    as kjax.rl.batch_packing.BatchPackedStep sizes them: `chunks` = minibatches x
    microbatches, each of B / chunks groups over `shards` batch shards; R the bucket of
    the fullest shard's sum; total = chunks x shards used x R rows of T."""
    micro = groups // chunks
    P = batch_packing.layout_shards(micro, shards)
    needed = batch_packing.shard_rows(used, chunks, shards)
    rows = batch_packing.bucket(needed, micro // P * n)
    return needed, rows, chunks * P * rows


def packed_forward_flops(c: LlamaConfig, B: int, S: int, T: int, total_rows: int) -> float:
    """forward_flops of B prompts and `total_rows` completion rows of T, however the rows
    are spread over the groups (forward_flops is affine in B N at fixed B)."""
    per_row = forward_flops(c, Shape(1, 1, S, T)) - forward_flops(c, Shape(1, 0, S, T))
    return forward_flops(c, Shape(B, 0, S, T)) + total_rows * per_row


def plan_real(cfg: TrainConfig, c: LlamaConfig, static: Plan, lengths: L.Lengths, *,
              devices=None, seed: int = 0, pack: PackMode = PackMode.GROUP,
              log: Callable[[str], None] = lambda _: None) -> RealPlan:  # fmt: skip
    """Compiles, on the static plan's mesh, the packed update (rl.pack = `pack`, GROUP or
    BATCH) at the rows `lengths` needs and the compacting sampler's decode step at its
    second and smallest batch sizes, and returns the RealPlan (one step of lengths:
    `lengths.tokens(B, N, T, seed)`)."""
    from kjax.rl.optim import make_optimizer
    from kjax.scale.chips import topology_devices

    shape = static.shape
    B, N, S, T = shape.B, shape.N, shape.S, shape.T
    devices = topology_devices(static.topology) if devices is None else devices
    mesh = sharding.make_mesh(*static.mesh, devices=devices)
    if pack not in (PackMode.GROUP, PackMode.BATCH):
        raise ValueError(f"plan_real: pack must be GROUP or BATCH; got {pack!r}.")
    rl = dataclasses.replace(cfg.rl, microbatches=static.microbatches, pack=pack)
    cfg = dataclasses.replace(cfg, rl=rl)
    tokens = lengths.tokens(B, N, T, seed)
    if pack is PackMode.BATCH:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            shards = sharding.batch_shards()  # as the traced update sees it
        chunks = rl.minibatches * rl.microbatches
        needed, rows, total_rows = batch_rows(L.group_rows(tokens, T), chunks, B, N, shards)
        micro = B // chunks
        rows_of, per = micro // batch_packing.layout_shards(micro, shards) * N, "batch shard"
    else:
        needed = L.rows_needed(tokens, T)
        rows = L.packed_rows(needed, N)
        rows_of, total_rows, per = N, B * rows, "group"
    params = abstract_params(c, param_dtype(cfg), mesh)
    state = abstract_state(params, make_optimizer(cfg.optimizer), mesh)
    label = f"{static.topology} mesh {'x'.join(map(str, static.mesh))} real tokens"
    log(f"{label}: compiling the packed update at R={rows} rows per {per} (needs {needed})")
    update = compile_update(cfg, c, mesh, state, shape, rows=rows)
    log(f"{label}: packed update compiled in {update.seconds:.0f} s")
    sizes = sampling.compact_sizes(B * N, compact_floor(cfg), static.mesh[0] * static.mesh[1])
    last = static.windows[-1][0]
    # The compacting sampler reads the weights in the static plan's sampler layout (the
    # reshard happens once per rollout, before any compaction).
    rules = sampler_layout.weight_rules(SamplerWeights(static.weights))
    sampler_params = abstract_params(c, param_dtype(cfg), mesh, rules)
    compact = []
    for r in sorted({sizes[1], sizes[-1]} if len(sizes) > 1 else set(), reverse=True):
        log(f"{label}: compiling the compacted decode step at {r} rows, window {last}")
        step = compile_decode(cfg, c, mesh, sampler_params, Shape(r, 1, S, T), last)
        compact.append((r, step))
    frozen = int(cfg.rl.needs_old_logprobs) + int(cfg.rl.kl_coef > 0)
    passes = 3 * cfg.rl.epochs + frozen
    prompt = S if lengths.prompt is None else lengths.prompt
    phases = list(static.windows)
    return RealPlan(
        static=static,
        lengths=lengths,
        mean_tokens=float(tokens.mean()),
        longest=int(tokens.max()),
        rows_needed=needed,
        rows_mean=float(L.group_rows(tokens, T).mean()),
        rows=rows,
        update=update,
        sizes=tuple(sizes),
        compact=tuple(compact),
        schedule=tuple(L.decode_schedule(tokens, tuple(sizes), phases)),
        static_schedule=tuple(L.decode_schedule(tokens, (B * N,), phases)),
        update_model_flops=passes * packed_forward_flops(c, B, S, T, total_rows),
        real_model_flops=passes * L.real_forward_flops(c, S, tokens),
        real_tokens=float(B * N * prompt + tokens.sum()),
        pack=pack.value,
        rows_of=rows_of,
        total_rows=total_rows,
    )


def summary(rp: RealPlan) -> dict:
    """The --out fields of a RealPlan (every figure compiled, not run)."""
    chip = rp.chip
    return {
        "lengths": dataclasses.asdict(rp.lengths),
        "mean_tokens": rp.mean_tokens,
        "longest": rp.longest,
        "rows_needed": rp.rows_needed,
        "rows_mean": rp.rows_mean,
        "rows": rp.rows,
        "pack": rp.pack,
        "rows_of": rp.rows_of,
        "total_rows": rp.total_rows,
        "update": dataclasses.asdict(rp.update),
        "update_model_flops": rp.update_model_flops,
        "update_flops_ratio": rp.update_flops_ratio,
        "real_model_flops": rp.real_model_flops,
        "real_tokens": rp.real_tokens,
        "sizes": rp.sizes,
        "compact": [[r, dataclasses.asdict(x)] for r, x in rp.compact],
        "schedule": rp.schedule,
        "static_schedule": rp.static_schedule,
        "update_seconds": rp.update_seconds,
        "update_compute_seconds": rp.update.compute_seconds(chip),
        "update_hbm_seconds": rp.update.hbm_seconds(chip),
        "update_ici_seconds": rp.update.ici_seconds(chip),
        "sampler_seconds": rp.sampler_seconds(),
        "static_sampler_on_lengths_seconds": rp.sampler_seconds(schedule=rp.static_schedule),
        "step_seconds": rp.step_seconds,
        "serial_step_seconds": rp.serial_step_seconds,
        "static_step_seconds": rp.static.step_seconds,
        "tokens_per_s_per_chip": rp.tokens_per_s_per_chip,
        "static_tokens_per_s_per_chip": rp.static_tokens_per_s_per_chip,
        "static_padded_tokens_per_s_per_chip": rp.static.tokens_per_s_per_chip,
        "speedup": rp.speedup,
        "update_mfu": rp.update_mfu,
        "update_serial_mfu": rp.update_serial_mfu,
        "static_update_mfu": rp.static_update_mfu,
        "peak_bytes": rp.peak_bytes,
        "fits": rp.fits,
        "label": "compiled, not run",
    }


def report(rp: RealPlan) -> str:
    """The real-token lines printed under a static plan's table."""
    p, chip = rp.static, rp.chip
    B, N, S, T = p.shape.B, p.shape.N, p.shape.S, p.shape.T
    u = rp.update
    GiB = 1 << 30
    if rp.pack == "batch":
        packed = (
            f"    packed update (rl.pack=BATCH): R = {rp.rows} rows per batch shard of a "
            f"microbatch (the fullest shard needs {rp.rows_needed} of G N = {rp.rows_of}; "
            f"{rp.total_rows} rows in all, the groups {rp.rows_mean:.1f} each on average); "
        )
    else:
        packed = (
            f"    packed update (rl.pack=GROUP): R = {rp.rows} rows per group (the fullest "
            f"group needs {rp.rows_needed} of N = {N}, the mean group {rp.rows_mean:.1f}); "
        )
    lines = [
        f"  real tokens  [compiled, not run]: {rp.lengths.describe(T)}",
        f"    this step's lengths: mean {rp.mean_tokens:,.0f} of T={T}, longest {rp.longest}; "
        f"{rp.real_tokens:,.0f} real tokens (B N x (prompt + completion)) of "
        f"{B * N * (S + T):,} counted static",
        packed + f"FLOPs {rp.update_flops_ratio:.2f}x its analytic count; peak "
        f"{u.peak_bytes / GiB:.1f} GiB; "
        "compute / HBM / ICI "
        f"{u.compute_seconds(chip):.2f} / {u.hbm_seconds(chip):.2f} / "
        f"{u.ici_seconds(chip):.2f} s -> {rp.update_seconds:.2f} s (padded "
        f"{p.update_seconds:.2f} s)",
        "    compacting sampler: sizes " + ", ".join(map(str, rp.sizes))
        + "; decode steps per size: "
        + ", ".join(f"{r}: {sum(n for rr, _, n in rp.schedule if rr == r)}" for r in rp.sizes
                    if any(rr == r for rr, _, _ in rp.schedule)),
    ]  # fmt: skip
    for r, x in rp.compact:
        lines.append(
            f"      compacted decode step at {r} rows (window {p.windows[-1][0]}) compiled: "
            f"compute / HBM / ICI {x.compute_seconds(chip) * 1e3:.2f} / "
            f"{x.hbm_seconds(chip) * 1e3:.2f} / {x.ici_seconds(chip) * 1e3:.2f} ms, peak "
            f"{x.peak_bytes / GiB:.1f} GiB; other sizes and windows interpolated"
        )
    lines += [
        f"    sampler {rp.sampler_seconds():.2f} s (static sampler: {p.sampler_seconds:.2f} s for "
        f"T - 1 steps; {rp.sampler_seconds(schedule=rp.static_schedule):.2f} s stopping at "
        f"the longest); RL step {rp.step_seconds:.2f} s overlapped "
        f"({rp.serial_step_seconds:.2f} s no overlap) against {p.step_seconds:.2f} s static",
        f"    real tokens/s/chip {rp.tokens_per_s_per_chip:,.0f} against the static step's "
        f"{rp.static_tokens_per_s_per_chip:,.0f} on real tokens ({rp.speedup:.2f}x; static "
        f"counting padding: {p.tokens_per_s_per_chip:,.0f})",
        f"    update MFU on real tokens {rp.update_mfu:.1%} overlapped "
        f"({rp.update_serial_mfu:.1%} no overlap); the padded update's on real tokens "
        f"{rp.static_update_mfu:.1%}",
        f"    peak {rp.peak_bytes / GiB:.1f} GiB: {'fits' if rp.fits else 'DOES NOT FIT'}; "
        f"compile: packed update {u.seconds:.0f} s, compacted decode steps "
        f"{sum(x.seconds for _, x in rp.compact):.0f} s",
    ]
    return "\n".join(lines)


TABLE_HEADER = (
    "| model | preset | slice | mesh x micro | lengths (mean of T, at cap) | R (needed) of N "
    "| RL step s static / real | tokens/s/chip static (padding counted) | static on real "
    "tokens | real tokens/s/chip | ratio | update MFU on real tokens, packed (padded) | peak "
    "GiB | fits |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(s: dict) -> str:
    """One row of docs/scale.md's real-token table from a --out summary with "real"."""
    r = s["real"]
    mesh = "x".join(str(x) for x in s["mesh"])
    n = s["shape"]["N"]
    if r.get("pack", "group") == "batch":  # R per batch shard of a microbatch
        n = f"{r['rows_of']} per shard"
    return (
        f"| {s['model']} | {s['config'].rpartition(':')[2]} | {s['topology']} | {mesh} x "
        f"{s['microbatches']} | {r['lengths']['mean']:.3f} ({r['mean_tokens']:,.0f} tokens), "
        f"{r['lengths']['tail']:.0%} | {r['rows']} ({r['rows_needed']}) of {n} | "
        f"{r['static_step_seconds']:.1f} / {r['step_seconds']:.1f} | "
        f"{r['static_padded_tokens_per_s_per_chip']:,.0f} | "
        f"{r['static_tokens_per_s_per_chip']:,.0f} | {r['tokens_per_s_per_chip']:,.0f} | "
        f"{r['speedup']:.2f}x | {r['update_mfu']:.1%} ({r['static_update_mfu']:.1%}) | "
        f"{r['peak_bytes'] / (1 << 30):.1f} of {s['hbm_bytes'] / (1 << 30):.0f} | "
        f"{'yes' if r['fits'] else 'no'} |"
    )
