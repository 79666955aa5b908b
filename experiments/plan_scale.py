"""Will this RL run fit a TPU pod, on which mesh, and how fast? Asked of the TPU compiler.

  pip install -e '.[tpu]'    # libtpu: compiles for TPU topologies on a CPU-only machine
  python -m experiments.plan_scale --config=experiments/configs/llama31_8b_math.py:passk \\
      --model=llama-3.1-8b --topology=v5p:4x4x4 [--mesh=1,8,8] [--search=3] [--out=plan.json]
  python -m experiments.plan_scale --config=experiments/configs/llama31_8b_math.py:passk \\
      --model=llama-3.1-8b --topology=v6e:4x4 --calibrate   # against MaxText's measurement

Builds kjax's own RL update (the trainer's jitted step: loss, optimizer, PPO epochs and
microbatches as configured) and grouped sampler (prefill, decode steps with the KV cache)
from abstract arrays on a mesh of the topology's devices and compiles them (kjax.scale);
prints per chip the bytes of parameters, optimizer state, gradients, temporaries, KV
cache and the peak against HBM, the FLOPs of an update and a decode step against the
analytic count, the collectives, and a roofline projection of the RL step.
--model: llama-3.1-8b, llama-3.1-70b (their config.json, below), or an HF directory /
config.json (no weights read); default: config.model.path's, or the TINY model.
--mesh: data,fsdp,tensor (default: the preset's layout for the slice, SLICE_LAYOUTS in
experiments/slices.py, else its config.mesh); --search=N compiles up to N
more meshes (data x fsdp x tensor, microbatches), those whose analytic memory bound fits
the chip first, and ranks all by projected step time. --lengths=mean=0.4[,tail=0.05]
(or a histogram, or a run's metrics.jsonl: kjax.scale.lengths.parse) also compiles, per
mesh, the packed update at the rows that distribution needs and the compacting sampler's
decode step at smaller live batches, and prints real tokens/s/chip and MFU on real tokens
beside the static figure (kjax.scale.real). --calibrate: kjax's plain
pre-training step of the model (kjax.scale.calibration; default mesh: fsdp over every
chip) instead of the RL step. Every figure is compiled, not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time

from experiments import slices
from experiments.train import load_config
from kjax.rl.config import ModelKind, TrainConfig, override

# config.json of the two Llama 3.1 sizes (huggingface.co/meta-llama/Llama-3.1-8B and
# Llama-3.1-70B, the fields kjax reads); the Instruct models have the same shapes.
_LLAMA31 = {
    "vocab_size": 128256,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "rms_norm_eps": 1e-5,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
KNOWN_MODELS = {
    "llama-3.1-8b": _LLAMA31
    | {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
       "num_attention_heads": 32},
    "llama-3.1-70b": _LLAMA31
    | {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
       "num_attention_heads": 64},
}  # fmt: skip

# Shapes a slice of each chip comes in (cloud.google.com/tpu/docs/<chip>), smallest first.
_SLICES = {
    "v4": ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16"],
    "v5p": ["2x2x1", "2x2x2", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16"],
    "v5e": ["2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"],
    "v6e": ["2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"],
    "h100": ["1", "2", "4", "8", "16", "32", "64"],  # GPUs ("h100:8"), 8 to a host
}
GiB = 1 << 30


def check_args(topology: str, mesh: str) -> tuple[list[str], tuple[int, ...] | None]:
    """(the --topology list, the --mesh sizes or None), each checked before anything
    needs the compiler (libtpu, CUDA): a ValueError names the flag and the fix."""
    topologies = [t.strip() for t in topology.split(",") if t.strip()]
    for t in topologies:
        chip, _, shape = t.partition(":")
        if chip in _SLICES and shape not in _SLICES[chip]:
            raise ValueError(
                f"--topology={t}: {chip} comes in {', '.join(_SLICES[chip])} ; pick one of those."
            )
    if not mesh:
        return topologies, None
    parts = mesh.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--mesh must be data,fsdp,tensor (three ints >= 1); got {mesh!r}.")
    sizes = tuple(int(p) for p in parts)
    for t in topologies:
        if t.partition(":")[0] in _SLICES:
            chips = math.prod(int(d) for d in t.partition(":")[2].split("x"))
            if math.prod(sizes) != chips:
                raise ValueError(
                    f"--mesh={mesh} uses {math.prod(sizes)} devices but --topology={t} has "
                    f"{chips}; give sizes whose product is {chips} (or leave --mesh out)."
                )
    return topologies, sizes


def model_config(cfg: TrainConfig, model: str):
    """The policy's LlamaConfig from --model, config.model.path, or the TINY sizes."""
    from kjax.models.config import LlamaConfig

    if model in KNOWN_MODELS:
        return LlamaConfig.from_hf(KNOWN_MODELS[model])
    path = model or (cfg.model.path if cfg.model.kind is ModelKind.HF_DIR else "")
    if path:
        file = pathlib.Path(path)
        file = file / "config.json" if file.is_dir() else file
        if not file.is_file():
            raise ValueError(
                f"--model: no config.json at {path!r}; give an HF directory, its config.json, "
                f"or one of {sorted(KNOWN_MODELS)}"
            )
        return LlamaConfig.from_hf(json.loads(file.read_text()))
    if cfg.model.kind is not ModelKind.TINY:
        raise ValueError(f"--model is needed for a {cfg.model.kind.name} model")
    from kjax.rl.components import tiny_model_config

    return tiny_model_config(cfg)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(cfg: TrainConfig, c, chips: int,
               hbm_bytes: int | None = None) -> list[tuple[tuple[int, int, int], int]]:  # fmt: skip
    """(data, fsdp, tensor), microbatches pairs that split B, tensor dividing the query
    heads and either dividing the kv heads or a multiple of them (the KV cache's rows
    then go over tensor, the training forward repeats the kv heads: kjax.sharding.
    cache_spec, kjax.models.attention.kv_weights_per_query_head), ordered by an analytic
    guess of what compiles to the fastest fitting step (fewest microbatches, then tensor
    parallelism just enough): the compiler ranks them after.
    With `hbm_bytes`, the meshes whose analytic memory estimate (kjax.scale.memory_bound:
    the update's state, saved residuals and workspace, and the sampler in the layout AUTO
    picks) fits it come first, the rest after by that estimate, smallest first."""
    from kjax.scale import Shape, memory_bound, param_dtype

    B, mini, out = cfg.batch_prompts, cfg.rl.minibatches, []
    for tensor in _divisors(chips):
        K = c.num_kv_heads
        if c.num_heads % tensor or (K % tensor and tensor % K):
            continue
        for fsdp in _divisors(chips // tensor):
            data = chips // tensor // fsdp
            rows = B // mini
            if B % mini or rows % (data * fsdp):
                continue
            for micro in _divisors(rows // (data * fsdp)):
                out.append(((data, fsdp, tensor), micro))
    speed = lambda m: (m[1] * m[0][2], -m[0][1], m[0][2])  # noqa: E731
    if hbm_bytes is None:
        return sorted(out, key=speed)
    import jax.numpy as jnp

    shape, itemsize = Shape.of(cfg), jnp.dtype(param_dtype(cfg)).itemsize
    kw = dict(
        act_itemsize=jnp.dtype(cfg.model.compute_dtype).itemsize,
        hbm_bytes=hbm_bytes,
        stream_split=cfg.rl.sequence_parallel,
    )
    bound = {m: memory_bound(c, shape, *m, mini, itemsize, **kw) for m in out}
    return sorted(out, key=lambda m: (bound[m] > hbm_bytes, bound[m] if bound[m] > hbm_bytes else 0,
                                      *speed(m)))  # fmt: skip


def smallest_topology(chip: str, state_bytes: int) -> str | None:
    """The smallest slice whose HBM holds the update's state (params, Adam moments,
    gradients) at least once over: a lower bound, activations not counted."""
    from kjax.scale import CHIPS

    for dims in _SLICES[chip]:
        if math.prod(int(d) for d in dims.split("x")) * CHIPS[chip].hbm_bytes > state_bytes:
            return f"{chip}:{dims}"
    return None


def _gib(x: float) -> str:
    return f"{x / GiB:8.2f}"


def report(p) -> str:
    """The per-chip table of one Plan (kjax.scale.Plan)."""
    d, f, t = p.mesh
    u, (d1, d2) = p.update, p.decode
    chip = p.chip
    lines = [
        f"{p.topology}: {p.chips} x {chip.name}, mesh data={d} fsdp={f} tensor={t}, "
        f"microbatches={p.microbatches}; B={p.shape.B} N={p.shape.N} S={p.shape.S} "
        f"T={p.shape.T}  [compiled, not run]",
        "  per chip                         GiB",
        f"  parameters                  {_gib(p.params_bytes)}",
        f"  optimizer state             {_gib(p.opt_bytes)}",
        f"  gradients (accumulator)     {_gib(p.grads_bytes)}   inside the update's temporaries",
        f"  update temporaries          {_gib(u.temp_bytes)}",
        f"  update peak                 {_gib(u.peak_bytes)}   of {chip.hbm_bytes / GiB:.0f}",
        f"  KV cache (prompt + own)     {_gib(p.kv_bytes)}",
        f"  sampler peak                {_gib(p.sampler_peak)}"
        + ("" if p.sampler else "   (prefill / decode step; --no-full-sampler)"),
        f"  peak                        {_gib(p.peak_bytes)}   "
        + ("fits" if p.fits else "DOES NOT FIT"),
    ]
    for part in (u, d1, d2, p.sampler):
        if part is not None and part.overflow:
            lines.append(f"  compiler ({part.name}): {part.overflow}")
    per_chip = lambda x: x / p.chips  # noqa: E731
    lines += [
        "  FLOPs per chip          compiled    analytic   ratio",
        f"  update              {u.flops:12.3e} {per_chip(p.update_model_flops):11.3e}"
        f" {p.update_flops_ratio:7.3f}",
    ]
    for part, model in zip((d1, d2), p.decode_model_flops, strict=True):
        lines.append(
            f"  {part.name:<18}{part.flops:12.3e} {per_chip(model):11.3e}"
            f" {part.flops / per_chip(model):7.3f}"
        )
    lines += decode_floor_lines(p)
    lines.append("  collectives per update step (count, GiB of results per chip; per loop trip)")
    lines += [
        f"    {kind:<20} {n:8d} {b / GiB:10.2f}" for kind, (n, b) in u.collectives.items() if n
    ]
    lines.append("  interconnect per update step (GiB each chip sends, by mesh axis; its links)")
    for axis, (sent, dims) in sorted(u.ici.items()):
        egress = chip.egress(dims)
        rate = f"{egress / 1e9:.0f} GB/s out" if egress else "no ICI figure"
        lines.append(f"    {axis:<20} {sent / GiB:10.2f}   {dims} torus dim(s), {rate}")
    if u.uncosted_kernels:
        lines.append(f"  {u.uncosted_kernels} Pallas kernel calls counted at 0 FLOPs (no cost)")
    ici = (
        f"{chip.ici_bandwidth / 1e9:.0f} GB/s ICI bidirectional"
        if chip.ici_bandwidth
        else "no ICI figure"
    )
    lines += [
        f"  projection per chip (roofline, uncalibrated: {chip.bf16_flops / 1e12:.0f} TFLOP/s, "
        f"{chip.hbm_bandwidth / 1e9:.0f} GB/s HBM, {ici}; {chip.source})",
        "                    compute s    HBM s    ICI s   overlapped (max)   no overlap (sum)",
    ]
    sampler_parts = {id(x): x for x in (p.reshard, p.prefill, d1, d2, p.sampler) if x}
    sampler_compile = sum(x.seconds for x in sampler_parts.values())
    for x in {id(x): x for x in (u, p.reshard, p.prefill, d1, d2) if x}.values():
        lines.append(
            f"    {x.name:<15}{x.compute_seconds(chip):10.2f}{x.hbm_seconds(chip):9.2f}"
            f"{x.ici_seconds(chip):9.2f}{x.seconds_on(chip):19.2f}{x.serial_seconds_on(chip):19.2f}"
        )
    lines += [
        f"    sampler (prefill + {p.shape.T} decode steps) {p.sampler_seconds:.2f} s overlapped; "
        f"RL step {p.step_seconds:.2f} s overlapped, {p.serial_step_seconds:.2f} s with no "
        "overlap",
        f"    {p.tokens_per_s_per_chip:,.0f} tokens/s/chip (B*N*(S+T) per step), update MFU "
        f"{p.update_mfu:.1%} overlapped ({p.update_serial_mfu:.1%} with no overlap)",
        f"  compile: update {u.seconds:.0f} s, sampler {sampler_compile:.0f} s",
    ]
    return "\n".join(lines)


def decode_floor_lines(p) -> list[str]:
    """The sampler's weight layout and each compiled decode step's HBM bytes beside its
    floor (kjax.scale.decode_floor), per chip."""
    gb = lambda x: f"{x / 1e9:.3f}"  # noqa: E731
    how = {
        "tensor": "tensor only, resharded once per rollout from the trainer's fsdp x tensor",
        "train": "the trainer's fsdp x tensor layout, gathered over fsdp every decode step",
    }[p.weights]
    lines = [f"  sampler weights: {how}"]
    if p.reshard is not None:
        r = p.reshard
        lines.append(
            f"    reshard per rollout: HBM {gb(r.bytes_accessed)} GB, ICI "
            f"{gb(sum(b for b, _ in r.ici.values()))} GB sent, {r.seconds_on(p.chip) * 1e3:.1f} ms"
        )
    lines.append(
        "  decode step per chip, GB  floor (weights + prompt K/V + own K/V)   compiled  ratio"
    )
    for i, part in enumerate(p.decode):
        f = p.decode_floors[i]
        terms = (
            f"{gb(sum(f.values()))} ({gb(f['weights'])} + {gb(f['prompt_kv'])} + {gb(f['own_kv'])})"
        )
        lines.append(
            f"    {part.name:<18}{terms:<40}{gb(part.bytes_accessed):>9} {p.floor_ratio(i):6.2f}"
        )
    return lines


def _floors(p) -> list[dict]:
    return [
        {"window": p.windows[0 if i == 0 else -1][0], **p.decode_floors[i],
         "floor": sum(p.decode_floors[i].values()), "compiled": p.decode[i].bytes_accessed,
         "ratio": p.floor_ratio(i)}
        for i in range(2)
    ]  # fmt: skip


def _summary(p, config: str, model: str, stream_split: bool) -> dict:
    return {
        "config": config,
        "model": model,
        "topology": p.topology,
        "chips": p.chips,
        "mesh": p.mesh,
        "microbatches": p.microbatches,
        "shape": dataclasses.asdict(p.shape),
        "params_bytes": p.params_bytes,
        "opt_bytes": p.opt_bytes,
        "kv_bytes": p.kv_bytes,
        "update": dataclasses.asdict(p.update),
        "prefill": dataclasses.asdict(p.prefill),
        "decode": [dataclasses.asdict(x) for x in p.decode],
        "sampler_weights": p.weights,
        "reshard": dataclasses.asdict(p.reshard) if p.reshard else None,
        "decode_floor": _floors(p),
        "sampler": dataclasses.asdict(p.sampler) if p.sampler else None,
        "peak_bytes": p.peak_bytes,
        "hbm_bytes": p.chip.hbm_bytes,
        "fits": p.fits,
        "update_model_flops": p.update_model_flops,
        "update_flops_ratio": p.update_flops_ratio,
        "update_seconds": p.update_seconds,
        "sampler_seconds": p.sampler_seconds,
        "step_seconds": p.step_seconds,
        "tokens_per_s_per_chip": p.tokens_per_s_per_chip,
        "update_mfu": p.update_mfu,
        "update_compute_seconds": p.update.compute_seconds(p.chip),
        "update_hbm_seconds": p.update.hbm_seconds(p.chip),
        "update_ici_seconds": p.update.ici_seconds(p.chip),
        "update_serial_seconds": p.update_serial_seconds,
        "serial_step_seconds": p.serial_step_seconds,
        "update_serial_mfu": p.update_serial_mfu,
        "chip": dataclasses.asdict(p.chip),
        "count": COUNT,
        "calibration": CALIBRATION,
        "stream_split": stream_split,  # rl.sequence_parallel: the residual stream split
        "label": "compiled, not run",
    }


# What a summary's figures are: the count that read the HLO, and how they were calibrated.
COUNT = "HBM as moved + ICI"
OLD_COUNT = "old: every array touched, no ICI"
CALIBRATION = "roofline, uncalibrated (calibration step: 1.12x MaxText's measured)"


TABLE_HEADER = (
    "| model | preset | slice | mesh (data, fsdp, tensor) x microbatches | peak GiB/chip "
    "| fits | update FLOPs / analytic | RL step s | tokens/s/chip | update MFU "
    "| update compute / HBM / ICI s | MFU, no overlap | count; calibration |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(s: dict) -> str:
    """One docs/scale.md row of a --out summary (every figure compiled, not run). A
    summary written before the ICI term reads "-" there and says its count."""
    preset = s["config"].rpartition(":")[2]
    mesh = "x".join(str(x) for x in s["mesh"])
    if "update_ici_seconds" in s:
        terms = (
            f"{s['update_compute_seconds']:.1f} / {s['update_hbm_seconds']:.1f} / "
            f"{s['update_ici_seconds']:.1f}"
        )
        serial = f"{s['update_serial_mfu']:.1%}"
    else:
        terms, serial = "-", "-"
    how = f"{s.get('count', OLD_COUNT)}; {s.get('calibration', CALIBRATION)}"
    return (
        f"| {s['model']} | {preset} | {s['topology']} | {mesh} x {s['microbatches']} "
        f"| {s['peak_bytes'] / GiB:.1f} of {s['hbm_bytes'] / GiB:.0f} | "
        f"{'yes' if s['fits'] else 'no'} | {s['update_flops_ratio']:.2f} | "
        f"{s['step_seconds']:.1f} | {s['tokens_per_s_per_chip']:,.0f} | {s['update_mfu']:.1%} "
        f"| {terms} | {serial} | {how} |"
    )


def parse(argv: list[str]):
    parser = argparse.ArgumentParser(prog="experiments.plan_scale", description=__doc__)
    parser.add_argument("--config", required=True, help="FILE.py:PRESET")
    parser.add_argument("--model", default="", help=f"{sorted(KNOWN_MODELS)} or an HF dir")
    parser.add_argument("--topology", required=True, help="e.g. v5p:4x4x4 (comma list)")
    parser.add_argument("--mesh", default="", help="data,fsdp,tensor (default: config.mesh)")
    parser.add_argument("--microbatches", type=int, default=0, help="default: config's")
    parser.add_argument("--search", type=int, default=0, help="more meshes to compile")
    parser.add_argument(
        "--no-full-sampler",
        action="store_true",
        help="skip compiling the whole sampler (its peak from its parts)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="compile kjax's pre-training step in MaxText's Llama-3.1-8B v6e configuration "
        "for --topology instead, and set its projection beside MaxText's measurement",
    )
    parser.add_argument(
        "--lengths",
        default="",
        help="completion lengths for a real-token projection: mean=F[,tail=F][,top=F]"
        "[,prompt=N], mean_tokens=N, hist=E:W/E:W, or a run's metrics.jsonl",
    )
    parser.add_argument("--out", default="", help="JSON of every plan")
    args, rest = parser.parse_known_args(argv)
    items = {}
    for item in rest:
        if not item.startswith("--config.") or "=" not in item:
            raise ValueError(f"unknown argument {item!r}; overrides look like --config.x.y=value.")
        path, _, value = item[len("--config.") :].partition("=")
        items[path] = value
    return args, override(load_config(args.config), items)


def calibration_report(r) -> str:
    """The calibration step's projection beside the measurement (kjax.scale.Calibration)."""
    chip, st, m = r.chip, r.step, r.measured
    return "\n".join(
        [
            f"{r.topology}: {r.chips} x {chip.name}, mesh {'x'.join(map(str, r.mesh))}: kjax's "
            f"pre-training step, per-device batch {r.per_device_batch} x sequence {r.seq}, "
            f"remat {r.remat}  [compiled, not run]",
            f"  step peak {st.peak_bytes / GiB:.1f} GiB of {chip.hbm_bytes / GiB:.0f}"
            + (f"; compiler: {st.overflow}" if st.overflow else ""),
            f"  FLOPs per chip {st.flops:.3e} compiled, "
            f"{r.flops_per_token * r.tokens_per_step_per_chip:.3e} in MaxText's count "
            f"({st.flops / (r.flops_per_token * r.tokens_per_step_per_chip):.2f}x)",
            f"  compute {st.compute_seconds(chip):.3f} s, HBM {st.hbm_seconds(chip):.3f} s "
            f"({st.bytes_accessed / 1e9:.1f} GB), ICI {st.ici_seconds(chip):.3f} s ("
            + ", ".join(f"{a} {b / 1e9:.1f} GB" for a, (b, _) in sorted(st.ici.items()))
            + ")",
            f"  projected {r.tokens_per_s_per_chip():,.0f} tokens/s/chip, MFU {r.mfu():.1%} "
            f"overlapped; {r.tokens_per_s_per_chip(True):,.0f}, {r.mfu(True):.1%} with no overlap",
            f"  measured  {m.tokens_per_s_per_chip:,.0f} tokens/s/chip, MFU {m.mfu:.2%} "
            f"({m.source})",
            f"  projected / measured: {r.ratio():.2f} overlapped, {r.ratio(True):.2f} with no "
            "overlap",
            f"  compile: {st.seconds:.0f} s",
        ]
    )


def _calibrate(args, c, topologies, mesh, log) -> int:
    from kjax.scale import calibration

    found, code = [], 0
    for topology in topologies:
        if not topology.startswith("v6e:"):
            log(f"{topology}: the measurement is of v6e; the ratio compares different chips")
        try:
            r = calibration.calibrate(
                c, topology, mesh_sizes=mesh, log=log, kernel_cost=calibration.kernel_cost(c)
            )
        except ValueError as e:  # the compiler could not measure it past HBM
            print(f"{topology}: the calibration step could not be compiled: {e}", flush=True)
            code = 1
            continue
        print(calibration_report(r), flush=True)
        found.append(r)
    if args.out:
        rows = [
            {
                "model": args.model,
                "topology": r.topology,
                "chips": r.chips,
                "mesh": r.mesh,
                "per_device_batch": r.per_device_batch,
                "seq": r.seq,
                "remat": r.remat,
                "step": dataclasses.asdict(r.step),
                "flops_per_token": r.flops_per_token,
                "compute_seconds": r.step.compute_seconds(r.chip),
                "hbm_seconds": r.step.hbm_seconds(r.chip),
                "ici_seconds": r.step.ici_seconds(r.chip),
                "tokens_per_s_per_chip": r.tokens_per_s_per_chip(),
                "serial_tokens_per_s_per_chip": r.tokens_per_s_per_chip(True),
                "mfu": r.mfu(),
                "serial_mfu": r.mfu(True),
                "ratio": r.ratio(),
                "serial_ratio": r.ratio(True),
                "measured": dataclasses.asdict(r.measured),
                "chip": dataclasses.asdict(r.chip),
                "count": COUNT,
                "label": "compiled, not run",
            }
            for r in found
        ]
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))
    log("done")
    return code


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[plan_scale {time.perf_counter() - start:6.0f} s] {msg}", flush=True)

    argv = sys.argv[1:] if argv is None else argv
    try:
        args, cfg = parse(argv)
        import jax.numpy as jnp

        from kjax import scale
        from kjax.scale import lengths as scale_lengths

        c = model_config(cfg, args.model)
        for topology in args.topology.split(","):
            scale.chip_of(topology.strip()), scale.topology_chips(topology.strip())
        topologies, mesh = check_args(args.topology, args.mesh)
        if mesh is None:
            for topology in topologies:
                try:
                    cfg.mesh.resolve(scale.topology_chips(topology))
                except ValueError as e:
                    raise ValueError(
                        f"--topology={topology}: {e} Give --mesh=DATA,FSDP,TENSOR for it."
                    ) from None
        lengths = scale_lengths.parse(args.lengths, scale.Shape.of(cfg).T) if args.lengths else None
    except ValueError as e:
        print(f"experiments.plan_scale: error: {e}", file=sys.stderr)
        return 2
    why = [scale.libtpu_missing(t) for t in topologies if scale.libtpu_missing(t)]
    if why:
        print(f"experiments.plan_scale: error: {why[0]}", file=sys.stderr)
        return 2
    log(f"{c.num_layers} layers, d={c.hidden_size}, vocab {c.vocab_size}; "
        f"{scale.matmul_params(c) / 1e9:.2f}B matmul params")  # fmt: skip
    if args.calibrate:
        return _calibrate(args, c, topologies, mesh, log)
    plans, code, reals = [], 0, {}
    for topology in topologies:
        chips = scale.topology_chips(topology)
        micro = args.microbatches or cfg.rl.microbatches
        first = (cfg.mesh.resolve(chips) if mesh is None else mesh), micro
        layout = slices.for_slice(cfg, args.config, topology.partition(":")[0], chips, argv)[1]
        if layout is not None:  # the preset's layout for this slice (experiments/slices.py)
            first = layout[0].resolve(chips), layout[1]
            log(f"{topology}: the preset's layout for it (SLICE_LAYOUTS): {first}")
        ordered = candidates(cfg, c, chips, scale.chip_of(topology).hbm_bytes)
        tried = [first] + [m for m in ordered if m != first][: args.search]
        found = []
        for sizes, m in tried:
            try:
                p = scale.plan(cfg, c, topology, sizes, m, full_sampler=not args.no_full_sampler,
                               log=log)  # fmt: skip
            except ValueError as e:
                log(f"{topology} mesh {sizes} micro {m}: skipped ({e})")
                continue
            found.append(p)
            print(report(p), flush=True)
            if lengths is not None:
                from kjax.scale import real

                try:
                    reals[id(p)] = real.plan_real(cfg, c, p, lengths, log=log)
                except ValueError as e:
                    log(f"{topology} mesh {sizes} micro {m}: real tokens skipped ({e})")
                    continue
                print(real.report(reals[id(p)]), flush=True)
        fitting = sorted((p for p in found if p.fits), key=lambda p: p.step_seconds)
        if not found:
            code = 1
            print(f"{topology}: no mesh tried could be compiled and measured (above).")
        elif not fitting:
            code = 1
            # params + gradients + Adam's two moments, in the params' dtype
            state = 4 * scale.param_count(c) * jnp.dtype(scale.param_dtype(cfg)).itemsize
            bigger = smallest_topology(topology.partition(":")[0], state)
            # what the least hungry mesh tried needs in all, were it spread evenly
            need = min(p.peak_bytes * p.chips for p in found)
            spread = smallest_topology(topology.partition(":")[0], need)
            print(
                f"{topology}: nothing fits. Smallest slice whose HBM holds params + "
                f"gradients + optimizer state ({state / GiB:.0f} GiB): "
                f"{bigger or 'none listed'} (a lower bound). The mesh tried needs "
                f"{need / GiB:,.0f} GiB in all (peak x chips); spread evenly that is "
                + (f"{spread} or more" if spread else "more than the largest slice listed")
                + " (an estimate: compile it to know)."
            )
        elif len(fitting) > 1:
            print(f"{topology}: meshes that fit, fastest projected RL step first:")
            for p in fitting:
                print(f"  data,fsdp,tensor={p.mesh} microbatches={p.microbatches}: "
                      f"{p.step_seconds:.2f} s, peak {p.peak_bytes / GiB:.1f} GiB")  # fmt: skip
        plans += found
    if args.out:
        model, split = args.model or cfg.model.path, cfg.rl.sequence_parallel
        summaries = [_summary(p, args.config, model, split) for p in plans]
        if reals:
            from kjax.scale import real

            for p, s in zip(plans, summaries, strict=True):
                if id(p) in reals:
                    s["real"] = real.summary(reals[id(p)])
        pathlib.Path(args.out).write_text(json.dumps(summaries, indent=1))
    log("done")
    return code


if __name__ == "__main__":
    sys.exit(main())
