"""Per-op profile of one loss+grad step at the SmolLM2-135M shape: kjax (HLO ops) vs PyTorch.

Command: python -m experiments.bench.profile_model [--layers 4] [--vocab 0] [--json PATH]
[--smoke]; prefix XLA_FLAGS=--xla_cpu_max_isa=AVX2 ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 for the AVX2 question. ~5 minutes at --layers 30 on 2 cores; the
figures measured so are in docs/performance.md ("Per op under the cap").
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import inspect
import json
import math
import os
import re
import tempfile
import time

import jax

from experiments.bench.bench_model import (
    SMOKE,
    SMOLLM2_135M,
    best_times,
    kjax_fns,
    matmul_fns,
    torch_fns,
)
from experiments.lab.provenance import cpu_features, cpu_model
from kjax import hlo_stats

# Opcodes that only move data: a fusion made of these alone is a copy or transpose.
_MOVES = set(
    "parameter copy transpose bitcast reshape broadcast constant slice concatenate pad tuple "
    "get-tuple-element iota convert".split()
)
# Thunks that only contain others: their events would count their bodies twice.
_CONTAINERS = {"while", "conditional", "call"}


def cpu_header() -> str:
    """The CPU model, the vector ISAs that matter here, and whether the AVX2 caps are set."""
    isa = [f for f in cpu_features() if f in ("avx2", "fma", "avx512f", "avx512_bf16")]
    caps = {k: os.environ.get(k, "") for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    xla = re.findall(r"--xla_cpu_max_isa=\S+", os.environ.get("XLA_FLAGS", ""))
    caps["XLA_FLAGS"] = " ".join(xla)
    capped = ", ".join(f"{k}={v}" for k, v in caps.items() if v) or "none (native ISA)"
    isas = ", ".join(isa) or "no AVX2"
    return f"{cpu_model()} ({os.cpu_count()} cores; {isas}); ISA caps: {capped}"


def parse_hlo(text: str) -> dict:
    """Instruction name -> {op, dims, args, rest} over the whole module (HLO names are
    module-unique; kjax.hlo_stats parses it), plus computation name -> its instruction
    names under key None."""
    comps = hlo_stats.computations(text)
    table = {}
    for body in comps.values():
        for i in body:
            dims = re.match(r"\w+\[([\d,]*)\]", i.type)
            table[i.name] = {
                "op": i.op,
                "dims": [int(d) for d in dims.group(1).split(",") if d] if dims else None,
                "args": i.operands,
                "rest": i.attrs,
            }
    table[None] = {comp: [i.name for i in body] for comp, body in comps.items()}
    return table


def _called(hlo: dict, name: str) -> list[str]:
    """Every instruction inside name's fused computations, recursively."""
    found = []
    for comp in re.findall(r"calls=\{?%([\w.\-]+)", hlo[name]["rest"]):
        for inner in hlo[None].get(comp, []):
            found += [inner, *_called(hlo, inner)]
    return found


def _dot(hlo: dict, name: str) -> tuple[float, str]:
    """2*prod(out)*prod(contracted) and a short lhs x rhs description of one dot."""
    instr = hlo[name]
    lhs, rhs = (hlo[a]["dims"] for a in instr["args"][:2])
    lc, rc = (_ints(f"{side}_contracting_dims", instr["rest"]) for side in ("lhs", "rhs"))
    flops = 2.0 * math.prod(instr["dims"]) * math.prod(lhs[d] for d in lc)
    lhs_s, rhs_s, lc_s, rc_s = (",".join(map(str, v)) for v in (lhs, rhs, lc, rc))
    return flops, f"[{lhs_s}]x[{rhs_s}] c=({lc_s};{rc_s})"


def _ints(attr: str, rest: str) -> list[int]:
    return [int(d) for d in re.search(attr + r"=\{([\d,]*)\}", rest).group(1).split(",") if d]


def classify(hlo: dict, name: str) -> tuple[str, float, str]:
    """(class, FLOPs per execution, dot shapes) of one executed HLO op."""
    if name not in hlo:
        return "other", 0.0, ""
    inner = [name, *_called(hlo, name)]
    dots = [i for i in inner if hlo[i]["op"] == "dot"]
    ops = {hlo[i]["op"] for i in inner[1:]} if len(inner) > 1 else {hlo[name]["op"]}
    if dots:
        flops, shapes = zip(*(_dot(hlo, d) for d in dots), strict=True)
        ynn = "__ynn_fusion" in hlo[name]["rest"]
        return ("dot (YNNPACK)" if ynn else "dot (XLA fallback)"), sum(flops), "; ".join(shapes)
    if ops & {"dynamic-slice", "dynamic-update-slice"}:
        return "dynamic-(update-)slice", 0.0, ""
    if ops <= _MOVES:
        return "copy / transpose", 0.0, ""
    if hlo[name]["op"] == "fusion" or ops & {"reduce", "add", "multiply", "exponential"}:
        return "elementwise / reduce fusion", 0.0, ""
    return "other", 0.0, ""


def trace_kjax(fn) -> tuple[float, dict]:
    """Wall seconds of one traced call and, per HLO op, {count, ms} where an op's time
    runs from its start to its completion event (the fallback's async dots included)."""
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            start = time.perf_counter()
            fn()
            wall = time.perf_counter() - start
        (path,) = glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)
        data = jax.profiler.ProfileData.from_file(path)
    starts, ends = [], {}
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                if e.name.startswith("end: ") and "_c" in stats:
                    ends[stats["_c"]] = e.start_ns
                elif "hlo_op" in stats:
                    starts.append((stats["hlo_op"], e.start_ns, e.duration_ns, stats.get("_p")))
    ops = {}
    for name, t0, dur, flow in starts:
        span = max(dur, ends.get(flow, t0) - t0) if flow is not None else dur
        op = ops.setdefault(name, {"count": 0, "ms": 0.0})
        op["count"] += 1
        op["ms"] += span / 1e6
    return wall, ops


def kjax_profile(step, untraced_s: float, peak: float) -> dict:
    """Per-op rows of one traced call of bench_model's kjax_step (compiled and warm)."""
    # The jitted step and its arguments live in bench_model's closure: lower that same
    # function for its optimised HLO rather than restating the loss here.
    env = inspect.getclosurevars(step).nonlocals
    hlo = parse_hlo(env["step"].lower(env["params"], env["tokens"]).compile().as_text())
    wall, ops = trace_kjax(step)
    rows = []
    for name, op in ops.items():
        if name in hlo and hlo[name]["op"] in _CONTAINERS:
            continue
        kind, flops, shapes = classify(hlo, name)
        rows.append({"op": name, "class": kind, "count": op["count"], "ms": op["ms"],
                     "share": op["ms"] / 1e3 / wall, "gflop": flops * op["count"] / 1e9,
                     "shapes": shapes})  # fmt: skip
    return _rates({"traced_s": wall, "untraced_s": untraced_s, "ops": rows}, peak)


def torch_profile(step, untraced_s: float, peak: float) -> dict:
    """Per-aten-op rows (by op and input shapes) of one profiled call of torch_step."""
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True, with_flops=True) as prof:
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.self_cpu_time_total <= 0:
            continue
        shapes = "x".join(str(s) for s in e.input_shapes[:2] if s) if e.flops else ""
        rows.append({"op": e.key, "class": "aten", "count": e.count,
                     "ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / 1e6 / wall,
                     "gflop": (e.flops or 0) / 1e9, "shapes": shapes})  # fmt: skip
    return _rates({"traced_s": wall, "untraced_s": untraced_s, "ops": rows}, peak)


def _rates(result: dict, peak: float) -> dict:
    """GFLOP/s of each op with FLOPs from its share of the traced step applied to the
    untraced step time: the profiler's overhead inflates absolute times, not shares."""
    result["ops"].sort(key=lambda r: -r["ms"])
    for r in result["ops"]:
        seconds = r["share"] * result["untraced_s"]
        r["gflops"] = r["gflop"] / seconds if r["gflop"] and seconds > 0 else None
        r["of_peak"] = r["gflops"] * 1e9 / peak if r["gflops"] else None
    classes = {}
    for r in result["ops"]:
        c = classes.setdefault(r["class"], dict(ms=0.0, share=0.0, gflop=0.0))
        c["class"] = r["class"]
        for key in ("ms", "share", "gflop"):
            c[key] += r[key]
    result["classes"] = sorted(classes.values(), key=lambda c: -c["ms"])
    for c in result["classes"]:
        seconds = c["share"] * result["untraced_s"]
        c["gflops"] = c["gflop"] / seconds if c["gflop"] and seconds > 0 else None
        c["of_peak"] = c["gflops"] * 1e9 / peak if c["gflops"] else None
    return result


_COLUMNS = "ms | share of step | GFLOP | GFLOP/s (of peak)"


def _fmt(r: dict) -> str:
    rate = f"{r['gflops']:.0f} ({r['of_peak']:.0%})" if r.get("gflops") else "-"
    return f"{r['ms']:.1f} | {r['share']:.1%} | {r['gflop']:.2f} | {rate}"


def report(result: dict, top: int) -> str:
    out = [result["header"], ""]
    for side in ("kjax", "torch"):
        s = result[side]
        out.append(f"{side}: step {s['untraced_s']:.3f} s untraced (best of the timing "
                   f"passes), {s['traced_s']:.3f} s traced; ms are traced, GFLOP/s are "
                   f"share x untraced step\n")  # fmt: skip
        if side == "kjax":
            out.append("(XLA's fallback dots run asynchronously beside other ops: an op's time")
            out.append("runs from its start to its completion, and the shares can sum past 100%)\n")
            out += [f"| class | {_COLUMNS} |", "|---|---|---|---|---|"]
            out += [f"| {c['class']} | {_fmt(c)} |" for c in s["classes"]]
            out.append("")
        head = f"| {side} op | class | count | {_COLUMNS} | dot shapes |"
        out += [head, "|---|---|---|---|---|---|---|---|"]
        for r in s["ops"][:top]:
            shapes = r["shapes"] if len(r["shapes"]) < 90 else r["shapes"][:87] + "..."
            out.append(f"| {r['op']} | {r['class']} | {r['count']} | {_fmt(r)} | {shapes} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=0, help="0: the model's full vocabulary")
    parser.add_argument("--repeats", type=int, default=2, help="untraced timing passes")
    parser.add_argument("--top", type=int, default=15, help="rows of each per-op table")
    parser.add_argument("--json", default=None, help="optional path for the figures")
    parser.add_argument("--smoke", action="store_true", help="tiny model and shapes: seconds")
    args = parser.parse_args(argv)
    config = dataclasses.replace(SMOLLM2_135M, num_layers=args.layers)
    sizes = (2048, 4096)
    if args.smoke:
        config, sizes, args.batch, args.seq, args.repeats = SMOKE, (256,), 2, 16, 1
    if args.vocab:
        config = dataclasses.replace(config, vocab_size=args.vocab)
    tokens = jax.random.randint(jax.random.key(1), (args.batch, args.seq), 0, config.vocab_size)
    fns = matmul_fns(sizes)
    fns["kjax_step"] = kjax_fns(config, tokens)["kjax_step"]
    fns["torch_step"] = torch_fns(config, tokens)["torch_step"]
    t = best_times(fns, args.repeats)
    rates = {k: 2 * int(k.rsplit("_", 1)[1]) ** 3 / v for k, v in t.items() if "matmul" in k}
    peak = max(rates.values())
    result = {
        "header": f"{cpu_header()}; float32 matmul peak {peak / 1e9:.0f} GFLOP/s "
        f"(best of {', '.join(f'{k[7:]} {r / 1e9:.0f}' for k, r in rates.items())}); "
        f"{config.num_layers} layers, vocab {config.vocab_size}, [B,S]=[{args.batch},{args.seq}]",
        "peak_gflops": peak / 1e9,
        "config": dict(
            layers=config.num_layers,
            vocab=config.vocab_size,
            hidden=config.hidden_size,
            batch=args.batch,
            seq=args.seq,
        ),
        "kjax": kjax_profile(fns["kjax_step"], t["kjax_step"], peak),
        "torch": torch_profile(fns["torch_step"], t["torch_step"], peak),
    }
    print(report(result, args.top))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
