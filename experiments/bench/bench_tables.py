"""Benchmark: where the wall time of one paper-table run goes, and what a big table costs.

  python -m experiments.bench.bench_tables [--table=tang2025_table] [--arm=NAME] [--steps=N]
      [--seed=0] [--smoke] [--out=F.json] [--plan_arms=10 --plan_seeds=20 --plan_steps=1000]

Runs ONE (arm, seed) of a table the way experiments/lab/harness.py does (table.base,
harness.with_seed, arm.make, the warm start built once per seed in its own workdir, then
the run's kjax.rl.loop.build_components loading it from the SFT cache) and prints
disjoint phases, which add up to at most the measured total (the rest is "other"):

  startup   a fresh Python process importing jax, kjax.rl.loop and the table module and
            initialising the backend (a subprocess, so it is what each worker pays, even
            when this process has imported them already)
  sft       the seed's warm start: build_components in WORKDIR/warm (SFT cache WORKDIR/sft)
  build     the run's build_components: model, data, mesh, optimizer, cached warm start
  rl_steps  kjax.rl.loop.rl_step: sample, verify, advantages, update
  eval      kjax.rl.loop.evaluate (before RL, every cfg.eval.every steps, at the end)
  io        checkpoint saves and their final wait, metrics rows, closing the run
  compile   JAX tracing, lowering and XLA compilation, wherever it happened (taken out
            of the phases above)

loop.py has no timing hooks, so the script drives the loop's own public pieces (Batches,
rl_step, evaluate, the Components' checkpointer and metrics writer) in the order
train_and_evaluate calls them, without the progress bar and the final plot. Compile time
comes from JAX's monitoring spans (/jax/core/compile/*: jaxpr trace, MLIR lowering,
backend compile or persistent-cache read), merged so that nested spans count once. Every
phase ends in jax.block_until_ready. Per-RL-step figures leave compile out; the first
step is usually still a little slower (allocations).

The plan estimate scales the measured phases: startup once (one process), the warm start
and its compile once per seed, build, the run's compile, RL steps, evals and checkpoints
once per run, with the eval and checkpoint counts of harness.budget at --plan_steps.
It assumes every arm costs what the measured one does (PPO arms update twice per step)
and no persistent compile cache (table_cli.setup_jax's cache serves arms that compile the
same step, so real compile is lower). No cache is enabled here unless
JAX_COMPILATION_CACHE_DIR is set; the report says which. --smoke uses harness.smoke_base
(1-layer model, 2 RL steps of 8 x 8, 4 SFT steps): 46 s measured, 54 s for the command, 35 s
of it compile (2 CPU cores at load 3, 2026-12-02). A benchmark, not a test: on a shared
machine, note the load (`uptime`) with the figures. The report names the CPU and its
float32 matmul peak, measured after the run, since the same table costs 2-3x more on one
2-core machine than on another.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

PHASES = ("startup", "sft", "build", "compile", "rl_steps", "eval", "io")
STEP_PARTS = ("sample", "verify", "advantages", "update")  # rl_step's time/* keys


class CompileClock:
    """Wall seconds JAX spent compiling, from its monitoring spans (nested ones once)."""

    def __init__(self):
        self.spans: list[tuple[float, float]] = []

    def __call__(self, event: str, start: float, end: float, **kwargs) -> None:
        if event.startswith("/jax/core/compile/"):
            self.spans.append((start, end))

    def within(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] (time.time()) covered by at least one compile span."""
        total, reach = 0.0, t0
        for start, end in sorted(self.spans):
            start, end = max(start, reach), min(end, t1)
            if end > start:
                total, reach = total + end - start, end
        return total


def measure_startup(table: str) -> float:
    """Wall seconds of a fresh process that imports what a table run imports."""
    code = f"import jax, kjax.rl.loop, experiments.tables.{table}; jax.devices()"
    t0 = time.time()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.time() - t0


_LOOP_PHASES = ("build", "rl_steps", "eval", "io")  # kjax.rl.seeds.train_seeds' timer


def _shape(cfg) -> dict:
    return {
        "B": cfg.batch_prompts,
        "N": cfg.samples,
        "T": cfg.max_new_tokens,
        "sft_steps": cfg.sft.steps,
        "layers": cfg.model.num_layers,
        "hidden": cfg.model.hidden_size,
        "eval_problems": cfg.eval.problems,
        "eval_samples": cfg.eval.n_eval,
    }


def _run_config(table, arm, seed: int, smoke: bool, steps: int, sft_dir, sft_seed=None):
    """The harness's config of (arm, seed), named by the arm, with `steps` RL steps (0: the
    table's) and, when sft_seed is given, that fixed warm start."""
    from experiments.lab import harness

    base = table.base(seed, smoke)
    if sft_seed is not None:
        base = dataclasses.replace(base, sft=dataclasses.replace(base.sft, seed=sft_seed))
    cfg = arm.make(harness.with_seed(base, seed, sft_dir))
    cfg = dataclasses.replace(cfg, name=harness.slug(arm.name))
    return harness.budget(cfg, steps, cfg.batch_prompts, cfg.samples) if steps else cfg


def _step_stats(step_ms: list[float]) -> dict:
    """mean, first and median-after-the-first of per-step milliseconds."""
    return {
        "mean": sum(step_ms) / len(step_ms),
        "first": step_ms[0],
        "median_after_first": statistics.median(step_ms[1:] or step_ms),
    }


def _result(table_name: str, arm, cfg, smoke: bool, phases: dict, compiled: dict, total: float):
    """What both breakdowns report besides their step figures."""
    import jax

    evals, saves = _counts(cfg)
    return {
        "table": table_name,
        "arm": arm.name,
        "smoke": smoke,
        "phases": {p: phases[p] for p in PHASES},
        "compile_by_phase": compiled,
        "total_s": total,
        "other_s": total - sum(phases.values()),
        "counts": {"steps": cfg.steps, "evals": evals, "checkpoint_saves": saves},
        "cfg": _shape(cfg),
        "compile_cache": jax.config.jax_compilation_cache_dir or None,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "load_average": os.getloadavg()[0],
    }


def machine(repeats: int = 5, n: int = 2048) -> dict:
    """The CPU's model and its float32 matmul peak (provenance.matmul_peak), measured after
    the run so that it does not share the cores with it: figures from two machines compare
    only beside their peaks."""
    from experiments.lab.provenance import cpu_model, matmul_peak

    peak = matmul_peak(n, repeats)
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "matmul_gflops": peak / 1e9}


def _machine_line(m: dict) -> str:
    return f"{m['cpu']} ({m['cores']} cores), float32 matmul peak {m['matmul_gflops']:.0f} GFLOP/s"


def _header(b: dict, what: str) -> list[str]:
    """A report's first lines: the run, the machine, the phase table."""
    total = b["total_s"]
    smoke = " (smoke)" if b["smoke"] else ""
    lines = [
        f"{b['table']} / {b['arm']} / {what}{smoke}: {b['cfg']}",
        f"{b['devices']}, load average {b['load_average']:.1f}, compile cache "
        f"{b['compile_cache'] or 'off'}",
        *([_machine_line(b["machine"])] if "machine" in b else []),
        "",
        "| phase | s | % of total |",
        "|---|---|---|",
    ]
    for name, s in [*b["phases"].items(), ("other", b["other_s"]), ("total", total)]:
        lines.append(f"| {name} | {s:.2f} | {100 * s / total:.0f} |")
    return lines


def pick_arm(table, name: str):
    from experiments.lab import harness

    if not name:
        return table.arms[0]
    for arm in table.arms:
        if name in (arm.name, harness.slug(arm.name)):
            return arm
    names = ", ".join(repr(a.name) for a in table.arms)
    raise ValueError(f"--arm={name!r} is not an arm of {table.name}; one of {names}")


def _counts(cfg) -> tuple[int, int]:
    """(evaluations, checkpoint saves) of a run of cfg, as train_and_evaluate makes them."""
    last = cfg.steps
    evals = 1 + sum(s % cfg.eval.every == 0 or s == last for s in range(1, last + 1))
    saves = sum(s % cfg.checkpoint.every == 0 or s == last for s in range(1, last + 1))
    return evals, saves


def breakdown(
    table_name: str,
    arm_name: str = "",
    *,
    workdir: pathlib.Path,
    steps: int = 0,
    seed: int = 0,
    smoke: bool = False,
    plan: tuple[int, int, int] = (10, 20, 1000),
    runs: int = 1,
) -> dict:
    """Trains `runs` seeds (seed, seed + 1, ...) of one arm of experiments.tables.<table_name>
    one after the other in this process, as the harness does, in workdir (empty). Returns
    {"phases": {phase: s} summed over the runs, "total_s", "other_s" (total minus the
    phases), "run_compile_s" (each run's compile outside its warm start: the first run
    compiles the update, later ones share it), "rl_step_ms", "counts" (per run), "cfg"
    (the run's shape), "estimate": estimate(..., *plan), ...}."""
    import jax
    from absl import logging

    from experiments.lab import harness
    from kjax.data import loader
    from kjax.rl import loop

    t_start = time.time()
    table = harness.load_table(table_name)
    arm = pick_arm(table, arm_name)
    logging.set_verbosity(logging.ERROR)
    startup = measure_startup(table_name)

    def config(seed: int):
        return _run_config(table, arm, seed, smoke, steps, workdir / "sft")

    cfg = config(seed)
    clock = CompileClock()
    wall = {p: 0.0 for p in PHASES if p not in ("startup", "compile")}
    compiled = dict(wall)

    def timed(phase: str, fn, *args, **kwargs) -> tuple:
        """(fn(*args, **kwargs), its seconds without compile); both add to phase's totals."""
        t0 = time.time()
        out = jax.block_until_ready(fn(*args, **kwargs))
        t1 = time.time()
        comp = clock.within(t0, t1)
        wall[phase] += t1 - t0
        compiled[phase] += comp
        return out, t1 - t0 - comp

    quiet = lambda *a, **k: None  # noqa: E731
    jax.monitoring.register_event_time_span_listener(clock)
    step_ms, rows, run_compile = [], [], []
    try:
        for run in range(runs):  # harness: the seed's warm start, then the run loads it
            cfg = config(seed + run)
            before = sum(compiled[p] for p in compiled if p != "sft")
            (warm, _), _ = timed("sft", loop.build_components, cfg, workdir / f"warm{run}", quiet)
            timed("sft", warm.close)
            (c, state), _ = timed("build", loop.build_components, cfg, workdir / f"run{run}", quiet)
            batches = loop.Batches(c.task.train, cfg.batch_prompts, cfg.seed, loader.Position())
            last_eval, _ = timed("eval", loop.evaluate, c, state.params)
            timed("io", c.metrics.write, {"step": 0, **last_eval})
            for step in range(cfg.steps):  # train_and_evaluate's loop, no progress bar or plot
                (state, row), s = timed("rl_steps", loop.rl_step, c, state, batches)
                step_ms.append(1e3 * s)
                rows.append(row)
                if (step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps:
                    last_eval, _ = timed("eval", loop.evaluate, c, state.params)
                    row.update(last_eval)
                timed("io", c.metrics.write, row)
                meta = {"position": dataclasses.asdict(batches.position)}
                last = step + 1 == cfg.steps
                timed("io", c.checkpointer.save, step + 1, state, meta, force=last)
            timed("io", c.checkpointer.wait)
            timed("io", c.close)
            run_compile.append(sum(compiled[p] for p in compiled if p != "sft") - before)
    finally:
        jax.monitoring.unregister_event_time_span_listener(clock)
    total = time.time() - t_start

    phases = {"startup": startup, **{p: wall[p] - compiled[p] for p in wall}}
    phases["compile"] = sum(compiled.values())
    later = rows[1:] or rows
    result = _result(table_name, arm, cfg, smoke, phases, compiled, total)
    parts = {p: 1e3 * statistics.median(r[f"time/{p}"] for r in later) for p in STEP_PARTS}
    result.update(seed=seed, runs=runs, run_compile_s=run_compile,
                  rl_step_ms={**_step_stats(step_ms), **parts})  # fmt: skip
    plan_cfg = harness.budget(cfg, plan[2], cfg.batch_prompts, cfg.samples)
    result["estimate"] = estimate(result, *plan, evals_saves=_counts(plan_cfg))
    return result


def lockstep_breakdown(
    table_name: str,
    arm_name: str = "",
    *,
    workdir: pathlib.Path,
    seeds: int = 20,
    steps: int = 0,
    smoke: bool = False,
    plan: tuple[int, int, int] = (10, 20, 1000),
) -> dict:
    """Trains `seeds` seeds of one arm of experiments.tables.<table_name> in lockstep the way the
    harness does (kjax.rl.seeds.train_seeds) in workdir (empty), with phases as breakdown's:
    sft is one warm start (every seed here loads it: sft.seed is fixed to 0, which changes
    no cost), build/rl_steps/eval/io come from train_seeds' timer, compile is taken out
    of each. Returns {"phases", "compile_by_phase", "total_s", "other_s", "step_ms" (one
    lockstep step of all seeds, compile excluded: mean, first, median after the first),
    "counts", "cfg", "estimate": lockstep_estimate(..., *plan), ...}."""
    import contextlib

    import jax
    from absl import logging

    from experiments.lab import harness
    from kjax.rl import loop
    from kjax.rl import seeds as seeds_lib

    t_start = time.time()
    table = harness.load_table(table_name)
    arm = pick_arm(table, arm_name)
    logging.set_verbosity(logging.ERROR)
    startup = measure_startup(table_name)
    # one shared warm start (sft.seed 0) for every seed
    cfgs = [_run_config(table, arm, s, smoke, steps, workdir / "sft", 0) for s in range(seeds)]
    cfg = cfgs[0]
    clock = CompileClock()
    intervals: dict[str, list[tuple[float, float]]] = {p: [] for p in ("sft", *_LOOP_PHASES)}

    @contextlib.contextmanager
    def timer(phase: str):
        t0 = time.time()
        try:
            yield
        finally:
            intervals[phase].append((t0, time.time()))

    quiet = lambda *a, **k: None  # noqa: E731
    jax.monitoring.register_event_time_span_listener(clock)
    try:
        with timer("sft"):
            warm, _ = loop.build_components(cfg, workdir / "warm", quiet)
            warm.close()
        seeds_lib.train_seeds(
            cfgs, [workdir / f"seed{c.seed}" for c in cfgs], log=quiet, progress=False, timer=timer
        )
    finally:
        jax.monitoring.unregister_event_time_span_listener(clock)
    total = time.time() - t_start

    wall = {p: sum(b - a for a, b in iv) for p, iv in intervals.items()}
    compiled = {p: sum(clock.within(a, b) for a, b in iv) for p, iv in intervals.items()}
    phases = {"startup": startup, **{p: wall[p] - compiled[p] for p in wall}}
    phases["compile"] = sum(compiled.values())
    step_ms = [1e3 * (b - a - clock.within(a, b)) for a, b in intervals["rl_steps"]]
    result = _result(table_name, arm, cfg, smoke, phases, compiled, total)
    result.update(seeds=seeds, step_ms=_step_stats(step_ms))
    plan_cfg = harness.budget(cfg, plan[2], cfg.batch_prompts, cfg.samples)
    result["estimate"] = lockstep_estimate(result, *plan, evals_saves=_counts(plan_cfg))
    return result


def lockstep_estimate(
    b: dict, arms: int, seeds: int, steps: int, *, evals_saves: tuple[int, int]
) -> dict:
    """Seconds of arms x seeds runs of `steps` RL steps, each arm's seeds in lockstep
    groups of b["seeds"] (the harness's --lockstep), from lockstep_breakdown b. Warm
    starts once per seed; build, compile, lockstep steps, evals and saves once per group
    (a group's cost is not linear in its seed count, so it is measured at that size)."""
    p, comp, n = b["phases"], b["compile_by_phase"], b["counts"]
    evals, saves = evals_saves
    groups = arms * math.ceil(seeds / b["seeds"])
    est = {
        "startup": p["startup"],
        "sft": seeds * (p["sft"] + comp["sft"]),
        "build": groups * p["build"],
        "compile": groups * sum(comp[q] for q in _LOOP_PHASES),
        "rl_steps": groups * steps * b["step_ms"]["median_after_first"] / 1e3,
        "eval": groups * evals * p["eval"] / n["evals"],
        "io": groups * saves * p["io"] / max(1, n["checkpoint_saves"]),
    }
    total = sum(est.values())
    return dict(arms=arms, seeds=seeds, steps=steps, evals_per_run=evals, phases=est, total_s=total)


def lockstep_report(b: dict) -> str:
    """lockstep_breakdown as Markdown: header, phase table, lockstep step, the estimate."""
    est, ms = b["estimate"], b["step_ms"]
    lines = _header(b, f"{b['seeds']} seeds in lockstep")
    lines += [
        "",
        f"Lockstep RL step of {b['seeds']} seeds, compile excluded: {ms['mean']:.0f} ms mean "
        f"over {b['counts']['steps']}, first {ms['first']:.0f}, median after the first "
        f"{ms['median_after_first']:.0f} ({ms['median_after_first'] / b['seeds']:.1f} ms per "
        "seed).",
        "",
        f"Estimate, {est['arms']} arms x {est['seeds']} seeds x {est['steps']:,} steps "
        f"({est['evals_per_run']} evals per run), each arm's seeds in lockstep groups of "
        f"{b['seeds']}, one process: "
        f"{est['total_s'] / 60:.1f} min = "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in est["phases"].items()),
    ]
    return "\n".join(lines)


def estimate(b: dict, arms: int, seeds: int, steps: int, *, evals_saves: tuple[int, int]) -> dict:
    """Seconds of arms x seeds runs of `steps` RL steps (evals_saves: (evaluations,
    checkpoint saves) per run at that budget), scaled from breakdown b: per run, b's
    phases over its b["runs"] runs; compile, each arm's first run as b's first and its
    other seeds as b's later runs (b's first, when b ran one)."""
    p, comp, n = b["phases"], b["compile_by_phase"], b["counts"]
    evals, saves = evals_saves
    runs, measured = arms * seeds, b["runs"]
    first, *later = b["run_compile_s"]
    later_s = statistics.mean(later) if later else first
    est = {
        "startup": p["startup"],
        "sft": seeds * (p["sft"] + comp["sft"]) / measured,
        "build": runs * p["build"] / measured,
        "compile": arms * first + arms * (seeds - 1) * later_s,
        "rl_steps": runs * steps * b["rl_step_ms"]["median_after_first"] / 1e3,
        "eval": runs * evals * p["eval"] / (n["evals"] * measured),
        "io": runs * saves * p["io"] / (max(1, n["checkpoint_saves"]) * measured),
    }
    total = sum(est.values())
    return dict(arms=arms, seeds=seeds, steps=steps, evals_per_run=evals, phases=est, total_s=total)


def _seeds_text(b: dict) -> str:
    if b["runs"] == 1:
        return f"seed {b['seed']}"
    return f"seeds {b['seed']}-{b['seed'] + b['runs'] - 1} one after the other in one process"


def report(b: dict) -> str:
    """The breakdown as Markdown: header, phase table, RL step, the plan estimate."""
    est, ms = b["estimate"], b["rl_step_ms"]
    lines = _header(b, _seeds_text(b))
    parts = ", ".join(f"{p} {ms[p]:.0f}" for p in STEP_PARTS)
    lines += [
        "",
        "Compile per run (outside the warm start): "
        + ", ".join(f"{s:.1f}" for s in b["run_compile_s"])
        + " s.",
        "",
        f"RL step, compile excluded: {ms['mean']:.0f} ms mean over "
        f"{b['counts']['steps'] * b['runs']}, "
        f"first {ms['first']:.0f}, median after the first {ms['median_after_first']:.0f} "
        f"({parts}).",
        "",
        f"Estimate, {est['arms']} arms x {est['seeds']} seeds x {est['steps']:,} steps "
        f"({est['evals_per_run']} evals per run), one process: {est['total_s'] / 3600:.1f} h = "
        + ", ".join(f"{k} {v / 3600:.2f} h" for k, v in est["phases"].items()),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="experiments.bench.bench_tables", description=__doc__.split("\n")[0]
    )
    p.add_argument("--table", default="tang2025_table", help="module experiments.tables.TABLE")
    p.add_argument("--arm", default="", help="arm name or its slug (default: the first arm)")
    p.add_argument("--steps", type=int, default=0, help="RL steps (default: the table's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=1,
                   help="train this many seeds (from --seed) one after the other in one "
                        "process, as a table does (later runs share the first's "
                        "compile)")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="harness.smoke_base budget (< 1 min)")
    p.add_argument("--out", default="", help="write the breakdown and estimate as JSON here")
    p.add_argument("--workdir", default="", help="keep the run here (default: a temp dir)")
    p.add_argument("--lockstep", type=int, default=0, metavar="S",
                   help="measure S seeds of the arm in lockstep, as the harness trains a "
                        "table (default 0: one run alone)")  # fmt: skip
    p.add_argument("--plan_arms", type=int, default=10)
    p.add_argument("--plan_seeds", type=int, default=20)
    p.add_argument("--plan_steps", type=int, default=1000)
    args = p.parse_args(argv)
    from experiments.lab import harness

    try:
        table = harness.load_table(args.table)
    except (ImportError, AttributeError):
        p.error(f"--table={args.table!r}: no module experiments.tables.{args.table} with a TABLE")
    try:
        pick_arm(table, args.arm)
    except ValueError as e:
        p.error(str(e))
    if args.steps < 0 or min(args.plan_arms, args.plan_seeds, args.plan_steps) < 1:
        p.error("--steps must be >= 0 and --plan_arms/--plan_seeds/--plan_steps >= 1")
    if args.runs < 1:
        p.error(f"--runs must be >= 1; got {args.runs}")
    if args.lockstep == 1 or args.lockstep < 0:
        p.error(f"--lockstep must be 0 (one run) or >= 2 seeds; got {args.lockstep}")
    if args.workdir and pathlib.Path(args.workdir).exists():
        p.error(f"--workdir={args.workdir} exists; give a new directory")
    with tempfile.TemporaryDirectory(prefix="bench_tables-") as tmp:
        workdir = pathlib.Path(args.workdir or tmp)
        plan = (args.plan_arms, args.plan_seeds, args.plan_steps)
        if args.lockstep:
            b = lockstep_breakdown(
                args.table,
                args.arm,
                workdir=workdir,
                seeds=args.lockstep,
                steps=args.steps,
                smoke=args.smoke,
                plan=plan,
            )
        else:
            b = breakdown(
                args.table,
                args.arm,
                workdir=workdir,
                steps=args.steps,
                seed=args.seed,
                smoke=args.smoke,
                plan=plan,
                runs=args.runs,
            )
    b["machine"] = machine()
    print(lockstep_report(b) if args.lockstep else report(b))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(b, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
