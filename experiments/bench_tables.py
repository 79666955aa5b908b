"""Benchmark: where the wall time of one paper-table run goes, and what a big table costs.

  python -m experiments.bench_tables [--table=tang2025_table] [--arm=NAME] [--steps=N]
      [--seed=0] [--smoke] [--out=F.json] [--plan_arms=10 --plan_seeds=20 --plan_steps=1000]

Runs ONE (arm, seed) of a table the way experiments/harness.py does (table.base,
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
and no persistent compile cache (harness.setup_jax's cache serves arms that compile the
same step, so real compile is lower). No cache is enabled here unless
JAX_COMPILATION_CACHE_DIR is set; the report says which. --smoke uses harness.smoke_base
(1-layer model, 2 RL steps of 8 x 8, 4 SFT steps): 46 s measured, 54 s for the command, 35 s
of it compile (2 CPU cores at load 3, 2026-12-02). A benchmark, not a test: on a shared
machine, note the load (`uptime`) with the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
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
    code = f"import jax, kjax.rl.loop, experiments.{table}; jax.devices()"
    t0 = time.time()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.time() - t0


def pick_arm(table, name: str):
    from experiments import harness

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
) -> dict:
    """Trains one (arm, seed) of experiments.<table_name> in workdir (empty). Returns
    {"phases": {phase: s}, "total_s", "other_s" (total minus the phases), "rl_step_ms",
    "counts", "cfg" (the run's shape), "estimate": estimate(..., *plan), ...}."""
    import jax
    from absl import logging

    from experiments import harness
    from kjax.data import loader
    from kjax.rl import loop

    t_start = time.time()
    table = importlib.import_module(f"experiments.{table_name}").TABLE
    arm = pick_arm(table, arm_name)
    logging.set_verbosity(logging.ERROR)
    startup = measure_startup(table_name)

    cfg = arm.make(harness.with_seed(table.base(seed, smoke), seed, workdir / "sft"))
    cfg = dataclasses.replace(cfg, name=harness.slug(arm.name))
    if steps:
        cfg = harness.budget(cfg, steps, cfg.batch_prompts, cfg.samples)
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
    try:  # harness: the seed's warm start in its own workdir, then the run loads it
        (warm, _), _ = timed("sft", loop.build_components, cfg, workdir / "warm", quiet)
        timed("sft", warm.close)
        (c, state), _ = timed("build", loop.build_components, cfg, workdir / "run", quiet)
        batches = loop.Batches(c.task.train, cfg.batch_prompts, cfg.seed, loader.Position())
        last_eval, _ = timed("eval", loop.evaluate, c, state.params)
        timed("io", c.metrics.write, {"step": 0, **last_eval})
        step_ms, rows = [], []
        for step in range(cfg.steps):  # train_and_evaluate's loop, minus progress bar and plot
            (state, row), s = timed("rl_steps", loop.rl_step, c, state, batches)
            step_ms.append(1e3 * s)
            rows.append(row)
            if (step + 1) % cfg.eval.every == 0 or step + 1 == cfg.steps:
                last_eval, _ = timed("eval", loop.evaluate, c, state.params)
                row.update(last_eval)
            timed("io", c.metrics.write, row)
            meta = {"position": dataclasses.asdict(batches.position)}
            timed("io", c.checkpointer.save, step + 1, state, meta, force=step + 1 == cfg.steps)
        timed("io", c.checkpointer.wait)
        timed("io", c.close)
    finally:
        jax.monitoring.unregister_event_time_span_listener(clock)
    total = time.time() - t_start

    phases = {"startup": startup, **{p: wall[p] - compiled[p] for p in wall}}
    phases["compile"] = sum(compiled.values())
    evals, saves = _counts(cfg)
    later = rows[1:] or rows
    result = {
        "table": table_name,
        "arm": arm.name,
        "seed": seed,
        "smoke": smoke,
        "phases": {p: phases[p] for p in PHASES},
        "compile_by_phase": compiled,
        "total_s": total,
        "other_s": total - sum(phases.values()),
        "rl_step_ms": {
            "mean": sum(step_ms) / len(step_ms),
            "first": step_ms[0],
            "median_after_first": statistics.median(step_ms[1:] or step_ms),
            **{p: 1e3 * statistics.median(r[f"time/{p}"] for r in later) for p in STEP_PARTS},
        },
        "counts": {"steps": cfg.steps, "evals": evals, "checkpoint_saves": saves},
        "cfg": {
            "B": cfg.batch_prompts,
            "N": cfg.samples,
            "T": cfg.max_new_tokens,
            "sft_steps": cfg.sft.steps,
            "layers": cfg.model.num_layers,
            "hidden": cfg.model.hidden_size,
            "eval_problems": cfg.eval.problems,
            "eval_samples": cfg.eval.n_eval,
        },
        "compile_cache": jax.config.jax_compilation_cache_dir or None,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "load_average": os.getloadavg()[0],
    }
    plan_cfg = lambda n: harness.budget(cfg, n, cfg.batch_prompts, cfg.samples)  # noqa: E731
    result["estimate"] = estimate(result, *plan, evals_saves=_counts(plan_cfg(plan[2])))
    return result


def estimate(b: dict, arms: int, seeds: int, steps: int, *, evals_saves: tuple[int, int]) -> dict:
    """Seconds of arms x seeds runs of `steps` RL steps (evals_saves: (evaluations,
    checkpoint saves) per run at that budget), scaled from breakdown b."""
    p, comp, n = b["phases"], b["compile_by_phase"], b["counts"]
    evals, saves = evals_saves
    runs = arms * seeds
    est = {
        "startup": p["startup"],
        "sft": seeds * (p["sft"] + comp["sft"]),
        "build": runs * p["build"],
        "compile": runs * (comp["build"] + comp["rl_steps"] + comp["eval"] + comp["io"]),
        "rl_steps": runs * steps * b["rl_step_ms"]["median_after_first"] / 1e3,
        "eval": runs * evals * p["eval"] / n["evals"],
        "io": runs * saves * p["io"] / max(1, n["checkpoint_saves"]),
    }
    total = sum(est.values())
    return dict(arms=arms, seeds=seeds, steps=steps, evals_per_run=evals, phases=est, total_s=total)


def report(b: dict) -> str:
    """The breakdown as Markdown: header, phase table, RL step, the plan estimate."""
    total, est, ms = b["total_s"], b["estimate"], b["rl_step_ms"]
    smoke = " (smoke)" if b["smoke"] else ""
    cache = b["compile_cache"] or "off"
    lines = [
        f"{b['table']} / {b['arm']} / seed {b['seed']}{smoke}: {b['cfg']}",
        f"{b['devices']}, load average {b['load_average']:.1f}, compile cache {cache}",
        "",
        "| phase | s | % of total |",
        "|---|---|---|",
    ]
    for name, s in [*b["phases"].items(), ("other", b["other_s"]), ("total", total)]:
        lines.append(f"| {name} | {s:.2f} | {100 * s / total:.0f} |")
    parts = ", ".join(f"{p} {ms[p]:.0f}" for p in STEP_PARTS)
    lines += [
        "",
        f"RL step, compile excluded: {ms['mean']:.0f} ms mean over {b['counts']['steps']}, "
        f"first {ms['first']:.0f}, median after the first {ms['median_after_first']:.0f} "
        f"({parts}).",
        "",
        f"Estimate, {est['arms']} arms x {est['seeds']} seeds x {est['steps']:,} steps "
        f"({est['evals_per_run']} evals per run), one process: {est['total_s'] / 3600:.1f} h = "
        + ", ".join(f"{k} {v / 3600:.2f} h" for k, v in est["phases"].items()),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiments.bench_tables", description=__doc__.split("\n")[0])
    p.add_argument("--table", default="tang2025_table", help="module experiments.TABLE")
    p.add_argument("--arm", default="", help="arm name or its slug (default: the first arm)")
    p.add_argument("--steps", type=int, default=0, help="RL steps (default: the table's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="harness.smoke_base budget (< 1 min)")
    p.add_argument("--out", default="", help="write the breakdown and estimate as JSON here")
    p.add_argument("--workdir", default="", help="keep the run here (default: a temp dir)")
    p.add_argument("--plan_arms", type=int, default=10)
    p.add_argument("--plan_seeds", type=int, default=20)
    p.add_argument("--plan_steps", type=int, default=1000)
    args = p.parse_args(argv)
    try:
        table = importlib.import_module(f"experiments.{args.table}").TABLE
    except (ImportError, AttributeError):
        p.error(f"--table={args.table!r}: no module experiments.{args.table} with a TABLE")
    try:
        pick_arm(table, args.arm)
    except ValueError as e:
        p.error(str(e))
    if args.steps < 0 or min(args.plan_arms, args.plan_seeds, args.plan_steps) < 1:
        p.error("--steps must be >= 0 and --plan_arms/--plan_seeds/--plan_steps >= 1")
    if args.workdir and pathlib.Path(args.workdir).exists():
        p.error(f"--workdir={args.workdir} exists; give a new directory")
    with tempfile.TemporaryDirectory(prefix="bench_tables-") as tmp:
        workdir = pathlib.Path(args.workdir or tmp)
        plan = (args.plan_arms, args.plan_seeds, args.plan_steps)
        b = breakdown(
            args.table,
            args.arm,
            workdir=workdir,
            steps=args.steps,
            seed=args.seed,
            smoke=args.smoke,
            plan=plan,
        )
    print(report(b))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(b, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
