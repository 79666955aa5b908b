"""Arms x seeds for the paper tables: run, resume, summarise, and judge each claim.

A table module declares a `Table` (arms, claims written before running, the metric
columns) and calls `main(table, argv)`. Each (arm, seed) trains in its own workdir
WORKDIR/runs/ARM/seedS through `kjax.rl.loop.train_and_evaluate` (no second trainer)
and leaves a `result.json` there when done, so an interrupted table resumes and finished
runs are skipped. Every arm of a seed warm-starts from the same SFT checkpoint
(SFT_DIR/seedS, shared through SFTConfig.cache_dir) and is evaluated on the same
held-out problems with the same sample count, with kjax's unbiased estimators.

Statistics: per-arm mean and 95% t-interval over seeds; per-claim paired differences
(same seed, same warm start) with their t-interval. A claim is "reproduced" when the
interval excludes 0 in the paper's direction, "opposite" when it excludes 0 the other
way, else "not reproduced (inconclusive)". Diverged runs (non-finite loss) are rows
with status "diverged": they are counted in the table and left out of differences.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import pathlib
import re
import time
from collections.abc import Callable, Sequence

import numpy as np

REPRODUCED, OPPOSITE, INCONCLUSIVE = "reproduced", "opposite", "not reproduced (inconclusive)"


class ClaimKind(enum.Enum):
    GREATER = "greater"  # the paper: arm > baseline
    LESS = "less"  # the paper: arm < baseline
    EQUIVALENT = "equivalent"  # the paper: arm matches baseline (|diff| <= margin)
    NONINFERIOR = "noninferior"  # the paper: arm at least as good (diff >= -margin)


@dataclasses.dataclass(frozen=True)
class Arm:
    """make(base config of one seed) -> that arm's TrainConfig. A function, so an arm whose
    enum members do not exist yet fails alone (status "unavailable"), not at import."""

    name: str
    make: Callable


@dataclasses.dataclass(frozen=True)
class Claim:
    """One paired comparison: metric(arm) - metric(baseline) over the same seeds."""

    id: str
    text: str  # the paper's statement and numbers
    metric: str
    arm: str
    baseline: str | None  # None: the arm's own value against 0 (e.g. a change over epochs)
    kind: ClaimKind = ClaimKind.GREATER
    margin: float = 0.0  # EQUIVALENT: the interval within +- margin; NONINFERIOR: > -margin


@dataclasses.dataclass(frozen=True)
class Table:
    """name: output file stem; base(seed, smoke) -> TrainConfig before the arm's changes;
    columns: (label, metric key) of the arm table; execute(table, arm, seed, run_dir,
    ctx) -> metrics dict (default: one RL run); per_seed(table, seed, ctx) -> {arm: {metric:
    value}} extra measurements merged into that seed's rows (e.g. gradient variance)."""

    name: str
    title: str
    arms: tuple[Arm, ...]
    claims: tuple[Claim, ...]
    columns: tuple[tuple[str, str], ...]
    base: Callable
    budget: str
    execute: Callable | None = None
    per_seed: Callable | None = None
    plot: Callable | None = None
    smoke_arms: tuple[str, ...] = ()  # --smoke trains only these (all if empty)
    derive: Callable | None = None  # metrics -> extra metrics computed from them (e.g. logs)


@dataclasses.dataclass(frozen=True)
class Context:
    workdir: pathlib.Path
    sft_dir: pathlib.Path
    smoke: bool
    log: Callable = print


_OLD_HOMES = ("kjax.rl.objective", "kjax.rl.train_step", "kjax.rl.optim")


def config_type(name: str):
    """A config type or enum by name from kjax.rl.config (the fixed home of every config
    type); while the trainer is mid-move, from its old module. AttributeError if absent."""
    import importlib

    for module in ("kjax.rl.config", *_OLD_HOMES):
        found = getattr(importlib.import_module(module), name, None)
        if found is not None:
            return found
    raise AttributeError(f"kjax.rl.config has no {name} yet")


def slug(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "_", name).strip("_").lower()


def with_seed(cfg, seed: int, sft_dir: pathlib.Path):
    """cfg for `seed`, its SFT warm start cached in sft_dir/seedS (shared by all arms)."""
    sft = dataclasses.replace(cfg.sft, cache_dir=str(sft_dir / f"seed{seed}"))
    return dataclasses.replace(cfg, seed=seed, sft=sft)


def budget(cfg, steps: int, batch: int, samples: int):
    """cfg with `steps` RL steps of `batch` prompts x `samples` (schedule, evals adjusted)."""
    warmup = min(cfg.optimizer.warmup_steps, steps - 1)
    opt = dataclasses.replace(cfg.optimizer, total_steps=steps, warmup_steps=warmup)
    ev = dataclasses.replace(cfg.eval, every=max(1, steps // 2))
    ck = dataclasses.replace(cfg.checkpoint, every=max(1, steps // 2))
    return dataclasses.replace(cfg, steps=steps, batch_prompts=batch, samples=samples,
                               optimizer=opt, eval=ev, checkpoint=ck)  # fmt: skip


SMOKE_BUDGET = ("SMOKE, not a result: 2 RL steps of 8 x 8 from a 4-step SFT, tiny eval; "
                "arms marked 'validated' were configured and validated, not trained")  # fmt: skip
SMOKE_SKIPPED = "validated"
RUNNING = "running in another worker"


def smoke_base(cfg):
    """The --smoke budget: a 1-layer d=32 model, 2 RL steps of 8 x 8, 4 SFT steps, a tiny
    eval (16 problems x 16 samples), on 1-digit problems. Same warm start for every module,
    so tests can share one SFT_DIR. Only Table.smoke_arms train (CI time); the other arms'
    configs are built and validated."""
    m = dataclasses.replace(cfg.model, hidden_size=32, num_layers=1, num_heads=2,
                            num_kv_heads=1, intermediate_size=64)  # fmt: skip
    task = dataclasses.replace(cfg.task, digits=1, train_size=150, test_size=16)
    sft = dataclasses.replace(cfg.sft, steps=4, batch_size=8)
    ev = dataclasses.replace(cfg.eval, n_eval=16, problems=16)
    cfg = dataclasses.replace(cfg, model=m, task=task, sft=sft, eval=ev, max_new_tokens=4)
    return budget(cfg, 2, 8, 8)


def rl_execute(table: Table, arm: Arm, seed: int, run_dir: pathlib.Path, ctx: Context) -> dict:
    """One RL run of arm at seed: the first and the last evaluation, and the run's shape."""
    from kjax.evaluation import read_jsonl
    from kjax.rl.loop import train_and_evaluate

    cfg = arm.make(with_seed(table.base(seed, ctx.smoke), seed, ctx.sft_dir))
    cfg = dataclasses.replace(cfg, name=slug(arm.name))
    last = train_and_evaluate(cfg, run_dir / "run", log=lambda *a, **k: None, progress=False)
    rows = [r for r in read_jsonl(run_dir / "run" / "metrics.jsonl") if "eval/pass@1" in r]
    start = {f"start/{k.removeprefix('eval/')}": v for k, v in rows[0].items() if "@" in k}
    return {**{k.removeprefix("eval/"): v for k, v in last.items()}, **start,
            "steps": cfg.steps, "B": cfg.batch_prompts, "N": cfg.samples}  # fmt: skip


def open_run(cfg, workdir: pathlib.Path, log=lambda *a, **k: None):
    """(handle, params after the SFT warm start) of cfg in workdir, for measurements
    outside the RL loop (kjax.rl.loop.build_components; loop.Run before it existed)."""
    from kjax.rl import loop

    if hasattr(loop, "build_components"):
        c, state = loop.build_components(cfg, workdir, log=log)
        return c, state.params
    run = loop.Run(cfg, workdir, log)
    return run, run.state.params


def sample_verified(handle, params, examples, key, n: int, temperature: float = 1.0):
    """n verified samples of each example: (prompts [B,S], prompt_mask [B,S], tokens
    [B,N,T], mask [B,N,T], Verdicts with scores [B,N]), host arrays."""
    from kjax import evaluation
    from kjax.rl import loop

    if hasattr(loop, "rollout"):
        ro = loop.rollout(handle, params, examples, key, n, temperature)
        return ro.prompts, ro.prompt_mask, ro.tokens, ro.mask, ro.verdicts
    prompts, pmask, ro, verdicts, _ = handle.rollout(params, examples, key, n, temperature)
    tokens, mask = evaluation.to_host(ro.tokens), evaluation.to_host(ro.mask)
    return prompts, pmask, tokens, mask, verdicts


def run_one(table: Table, arm: Arm, seed: int, ctx: Context) -> dict:
    """The result row of (arm, seed), from its result.json when already done."""
    run_dir = ctx.workdir / "runs" / slug(arm.name) / f"seed{seed}"
    done = run_dir / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    row = {"table": table.name, "arm": arm.name, "seed": seed}
    try:  # building the config is where a kjax name that has not landed yet fails
        arm.make(table.base(seed, ctx.smoke))
    except (AttributeError, ImportError, TypeError) as e:
        row.update(status="unavailable", metrics={}, error=f"{type(e).__name__}: {e}",
                   wall_s=0.0)  # fmt: skip
        ctx.log(f"[{table.name}] {arm.name}: unavailable ({row['error']})")
        return row  # not marked done: retried when the table is rerun
    if ctx.smoke and table.smoke_arms and arm.name not in table.smoke_arms:
        import jax  # keep CI short: the other arms' configs are built and validated only

        arm.make(with_seed(table.base(seed, True), seed, ctx.sft_dir)).validate(jax.device_count())
        return {**row, "status": SMOKE_SKIPPED, "metrics": {}, "wall_s": 0.0}
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "lock", "w") as lock:  # several workers may share one table
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {**row, "status": RUNNING, "metrics": {}, "wall_s": 0.0}
        if done.exists():  # another worker finished it meanwhile
            return json.loads(done.read_text())
        start = time.time()
        try:
            metrics = (table.execute or rl_execute)(table, arm, seed, run_dir, ctx)
            finite = all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
            row.update(status="ok" if finite else "diverged", metrics=metrics)
        except FloatingPointError as e:
            row.update(status="diverged", metrics={}, error=str(e).splitlines()[0])
        row["wall_s"] = round(time.time() - start, 1)
        done.write_text(json.dumps(row, indent=1))
    ctx.log(f"[{table.name}] {arm.name} seed {seed}: {row['status']} ({row['wall_s']} s)")
    return row


def warm_start(table: Table, seed: int, ctx: Context) -> None:
    """Builds seed's shared SFT warm start once, under a file lock, so that tables run in
    parallel with one --sft_dir never train the same warm start twice at the same time."""
    import fcntl

    cfg = with_seed(table.base(seed, ctx.smoke), seed, ctx.sft_dir)
    if not cfg.sft.steps:
        return
    ctx.sft_dir.mkdir(parents=True, exist_ok=True)
    with open(ctx.sft_dir / f"seed{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        handle, _ = open_run(cfg, ctx.workdir / "runs" / "_warm_start" / f"seed{seed}", ctx.log)
        getattr(handle, "close", lambda: None)()
        fcntl.flock(lock, fcntl.LOCK_UN)


def run_table(table: Table, seeds: Sequence[int], ctx: Context) -> list[dict]:
    rows = []
    for seed in seeds:  # seed-major: each warm start is built once, then reused
        warm_start(table, seed, ctx)
        seed_rows = [run_one(table, arm, seed, ctx) for arm in table.arms]
        if table.per_seed is not None:
            extra_path = ctx.workdir / "runs" / "_per_seed" / f"seed{seed}.json"
            if not extra_path.exists():
                extra_path.parent.mkdir(parents=True, exist_ok=True)
                extra = table.per_seed(table, seed, ctx)
                extra_path.write_text(json.dumps(extra, indent=1))
            merge(table, seed_rows, json.loads(extra_path.read_text()))
        else:
            merge(table, seed_rows, {})
        rows += seed_rows
    return rows


def merge(table: Table, rows: list[dict], extra: dict) -> None:
    """Adds the per-seed measurements and the table's derived metrics to each row."""
    for row in rows:
        row["metrics"] = {**row["metrics"], **extra.get(row["arm"], {})}
        if table.derive is not None and row["status"] == "ok":
            row["metrics"].update(table.derive(row["metrics"]))


# ----------------------------------------------------------------------------- statistics


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% Student-t interval; low = high = nan for < 2 values."""
    from scipy import stats

    x = np.asarray(values, float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def verdict(kind: ClaimKind, low: float, high: float, margin: float = 0.0) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if kind is ClaimKind.EQUIVALENT:  # opposite: clearly different, beyond the margin
        if low > margin or high < -margin:
            return OPPOSITE
        return REPRODUCED if -margin <= low and high <= margin else INCONCLUSIVE
    if kind is ClaimKind.NONINFERIOR:  # opposite: clearly worse
        return OPPOSITE if high < 0 else REPRODUCED if low > -margin else INCONCLUSIVE
    sign = 1.0 if kind is ClaimKind.GREATER else -1.0
    lo, hi = sorted((sign * low, sign * high))
    return REPRODUCED if lo > 0 else OPPOSITE if hi < 0 else INCONCLUSIVE


def values(rows: list[dict], arm: str, metric: str) -> dict[int, float]:
    """{seed: value} of the arm's finished runs."""
    return {r["seed"]: r["metrics"][metric] for r in rows
            if r["arm"] == arm and r["status"] == "ok" and metric in r["metrics"]}  # fmt: skip


def judge(rows: list[dict], claim: Claim) -> dict:
    a = values(rows, claim.arm, claim.metric)
    b = values(rows, claim.baseline, claim.metric) if claim.baseline else dict.fromkeys(a, 0.0)
    seeds = sorted(set(a) & set(b))
    mean, low, high = t_interval([a[s] - b[s] for s in seeds])
    return {"claim": claim.id, "mean": mean, "low": low, "high": high, "seeds": len(seeds),
            "verdict": verdict(claim.kind, low, high, claim.margin)}  # fmt: skip


def fmt(mean: float, low: float, high: float, digits: int = 3) -> str:
    if not math.isfinite(mean):
        return "n/a"
    if not math.isfinite(low):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def arm_table(rows: list[dict], arms: Sequence[str], columns) -> str:
    head = "| arm | " + " | ".join(label for label, _ in columns) + " | runs |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        cells = [fmt(*t_interval(list(values(rows, arm, key).values()))) for _, key in columns]
        kinds = ("ok", "diverged", "unavailable", SMOKE_SKIPPED, RUNNING)
        status = {s: sum(r["status"] == s for r in mine) for s in kinds}
        runs = ", ".join(f"{n} {s}" for s, n in status.items() if n) or "0"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {runs} |")
    start = [f"start/{key}" for _, key in columns]
    first = arms[0]
    if all(values(rows, first, key) for key in start):  # the shared warm start, before RL
        cells = [fmt(*t_interval(list(values(rows, first, key).values()))) for key in start]
        n = len(values(rows, first, start[0]))
        lines.append("| SFT warm start (before RL) | " + " | ".join(cells) + f" | {n} ok |")
    return "\n".join(lines)


def claims_table(rows: list[dict], claims: Sequence[Claim]) -> str:
    lines = ["| claim | paper | metric | arm - baseline | paired diff [95% CI] | seeds | verdict |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in claims:
        j = judge(rows, c)
        vs = f"{c.arm} - {c.baseline}" if c.baseline else f"{c.arm} (vs 0)"
        diff = fmt(j["mean"], j["low"], j["high"])
        lines.append(f"| {c.id} | {c.text} | {c.metric} | {vs} | {diff} | {j['seeds']} | "
                     f"{j['verdict']} |")  # fmt: skip
    return "\n".join(lines)


def report(table: Table, rows: list[dict], seeds: Sequence[int], smoke: bool) -> str:
    """The Markdown of the table: budget, arm table, claims with verdicts, run time."""
    hours = sum(r.get("wall_s", 0.0) for r in rows) / 3600
    diverged = [f"{r['arm']} (seed {r['seed']})" for r in rows if r["status"] == "diverged"]
    unavailable = sorted({r["arm"] for r in rows if r["status"] == "unavailable"})
    parts = [f"## {table.title}", "",
             f"Budget: {SMOKE_BUDGET if smoke else table.budget}. Seeds: "
             f"{', '.join(map(str, seeds))}. Cells: mean over seeds [95% t-interval].", "",
             arm_table(rows, [a.name for a in table.arms], table.columns), "",
             claims_table(rows, table.claims), "",
             f"Diverged: {', '.join(diverged) or 'none'}. Unavailable arms: "
             f"{', '.join(unavailable) or 'none'}. Compute: {hours:.2f} h of run time "
             "(sum over runs)."]  # fmt: skip
    return "\n".join(parts) + "\n"


def bar_plot(table: Table, rows: list[dict], path: pathlib.Path) -> None:
    """Grouped bars with 95% intervals: the @k metrics in one panel (a group per column,
    a bar per arm), every other column (e.g. gradient variance) in its own log panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a.name for a in table.arms]
    rates = [c for c in table.columns if "@" in c[1]]
    others = [c for c in table.columns if "@" not in c[1]]
    panels = [rates] + [[c] for c in others] if rates else [[c] for c in others]
    widths = [max(4, 1.1 * len(p) * len(arms) / 3) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4.2), squeeze=False,
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    width = 0.8 / len(arms)
    for ax, cols in zip(axes[0], panels, strict=True):
        for i, arm in enumerate(arms):
            stats = [t_interval(list(values(rows, arm, key).values())) for _, key in cols]
            mean = np.array([s[0] for s in stats])
            err = np.array([[s[0] - s[1], s[2] - s[0]] for s in stats]).T
            ax.bar(np.arange(len(cols)) + i * width, mean, width, label=arm,
                   yerr=np.nan_to_num(err), capsize=2)  # fmt: skip
        ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2, [label for label, _ in cols])
        if cols is not rates:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("mean over seeds, 95% CI")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle(table.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(table: Table, rows: list[dict], seeds, smoke: bool, out: pathlib.Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{table.name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report(table, rows, seeds, smoke)
    (out / f"{table.name}.md").write_text(text)
    (table.plot or bar_plot)(table, rows, out / f"{table.name}.png")
    return text


def parse(prog: str, argv=None, default_seeds: int = 5) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"experiments.{prog}")
    p.add_argument("--workdir", required=True, help="runs under WORKDIR/runs; outputs in WORKDIR")
    p.add_argument("--seeds", type=int, default=default_seeds,
                   help=f"seeds 0..SEEDS-1 (default {default_seeds})")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, tiny eval (CI)")
    p.add_argument("--sft_dir", default="", help="shared SFT warm starts (default WORKDIR/sft)")
    p.add_argument("--report_only", action="store_true",
                   help="train nothing: tabulate the seeds whose arms all finished")  # fmt: skip
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1; got {args.seeds}")
    return args


def setup_jax(workdir: pathlib.Path) -> None:
    """Quiet TFDS, and a persistent compile cache: arms that differ only in their
    advantages compile the same train step, so later runs load it instead of compiling."""
    import jax
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR may share one
        jax.config.update("jax_compilation_cache_dir", str(workdir / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def finished_rows(table: Table, seeds: Sequence[int], ctx: Context) -> tuple[list, list]:
    """(rows, seeds) of the leading seeds whose every arm (and per-seed measurement) has
    finished; stops at the first incomplete seed, so no seed is ever picked."""
    rows, done = [], []
    for seed in seeds:
        paths = [ctx.workdir / "runs" / slug(a.name) / f"seed{seed}" / "result.json"
                 for a in table.arms]  # fmt: skip
        extra = ctx.workdir / "runs" / "_per_seed" / f"seed{seed}.json"
        if not all(p.exists() for p in paths) or (table.per_seed and not extra.exists()):
            break
        seed_rows = [json.loads(p.read_text()) for p in paths]
        merge(table, seed_rows, json.loads(extra.read_text()) if table.per_seed else {})
        rows, done = rows + seed_rows, done + [seed]
    return rows, done


def main(table: Table, argv=None, default_seeds: int = 5) -> int:
    args = parse(table.name, argv, default_seeds)
    workdir = pathlib.Path(args.workdir)
    setup_jax(workdir)
    seeds = [0] if args.smoke else list(range(args.seeds))
    ctx = Context(workdir, pathlib.Path(args.sft_dir or workdir / "sft"), args.smoke)
    start = time.time()
    if args.report_only:
        rows, seeds = finished_rows(table, seeds, ctx)
    else:
        rows = run_table(table, seeds, ctx)
    text = write_outputs(table, rows, seeds, args.smoke, workdir)
    print(f"\n{text}\nwall time of this invocation: {(time.time() - start) / 60:.1f} min; "
          f"{workdir}/{table.name}.{{md,jsonl,png}}")  # fmt: skip
    return 0
