"""experiments.plan_scale's printed report, `--out` summary and docs/scale.md table row
of a compiled plan (kjax.scale.Plan), and the calibration step's report."""

from __future__ import annotations

import dataclasses

GiB = 1 << 30


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


def summary(p, config: str, model: str, stream_split: bool) -> dict:
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
    summary written before the ICI term reads "-" there and says its count; one compiled
    with `rl.sequence_parallel` says "residual split" after its mesh."""
    preset = s["config"].rpartition(":")[2]
    mesh = "x".join(str(x) for x in s["mesh"])
    split = ", residual split" if s.get("stream_split") else ""  # rl.sequence_parallel on
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
        f"| {s['model']} | {preset} | {s['topology']} | {mesh} x {s['microbatches']}{split} "
        f"| {s['peak_bytes'] / GiB:.1f} of {s['hbm_bytes'] / GiB:.0f} | "
        f"{'yes' if s['fits'] else 'no'} | {s['update_flops_ratio']:.2f} | "
        f"{s['step_seconds']:.1f} | {s['tokens_per_s_per_chip']:,.0f} | {s['update_mfu']:.1%} "
        f"| {terms} | {serial} | {how} |"
    )


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
