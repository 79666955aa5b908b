"""Arms x seeds for the paper tables: run, resume, summarise, and judge each claim.

A table module declares a `Table` (arms, claims written before running, the metric
columns) and calls `main(table, argv)`. Each (arm, seed) trains in its own workdir
WORKDIR/runs/ARM/seedS through `kjax.rl.loop.train_and_evaluate` (or, with --lockstep=S,
S of an arm's pending seeds at a time through `kjax.rl.seeds.train_seeds`: the same runs
in lockstep under one compiled step) and leaves a `result.json` there when done, so an
interrupted table resumes and finished runs are skipped. Every arm of a seed warm-starts
from the same SFT checkpoint (SFT_DIR/seedS, shared through SFTConfig.cache_dir) and is
evaluated on the same held-out problems with the same sample count, with kjax's unbiased
estimators. Runs of one process that differ only in their seed share one compiled update
(kjax.rl.components), so a table compiles each arm's step once.

Statistics (per-arm intervals, paired claims, Holm, TOST, MDE): experiments.claims.
Provenance of every row and table: experiments.provenance.

Diverged runs (non-finite loss, FloatingPointError) are rows with status "diverged": counted
in the table, left out of differences. Any other exception of an arm stops the table
(ArmFailed names arm and seed; the CLI exits 1): a broken arm is never a result. Every row
records the provenance() of the process that ran it, and NAME.md that of its writer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from experiments import tuning
from experiments.claims import Claim, MetricKey
from experiments.provenance import provenance
from experiments.report import RUNNING, SMOKE_SKIPPED, write_outputs
from experiments.tuning import Tuning


@dataclasses.dataclass(frozen=True)
class Arm:
    """make(base config of one seed) -> that arm's TrainConfig. select: the validation
    metric a Tuning picks its learning rate by (None: "objective", the value of the
    objective the arm trains for)."""

    name: str
    make: Callable
    select: str | None = None


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
    tuning: Tuning | None = None  # each arm's learning rate by experiments.tuning's protocol


def _as_is(arm, cfg):
    return cfg


@dataclasses.dataclass(frozen=True)
class Context:
    """workdir, sft_dir, smoke: from the command line. runs: the folder of WORKDIR the
    runs go in. adjust(arm, cfg) -> cfg: the last change to every run's config (a tuning
    run's rate and split, or the rate tuning chose)."""

    workdir: pathlib.Path
    sft_dir: pathlib.Path
    smoke: bool
    log: Callable = print
    runs: str = "runs"
    adjust: Callable = _as_is
    validate_only: bool = False  # build and validate every arm's config, train none
    report_only: bool = False  # train nothing: a run not finished is an error (tuning)
    lockstep: int = 0  # >= 2: an arm's pending seeds train in groups of this many together
    reuse: tuple[pathlib.Path, ...] = ()  # other tables' workdirs whose identical runs count


class ArmFailed(RuntimeError):
    """An arm raised while being built or run (not a divergence): a bug, never a result."""


# ---------------------------------------------------------------------------------- runs


def slug(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "_", name).strip("_").lower()


def task_slug(task) -> str:
    """The task kind, and its reward when not the kind's default (Countdown's exact-hit
    tables 1 and 2 beside table 3's near-miss one): a warm start records its task, so two
    tasks sharing one --sft_dir need two folders."""
    reward = getattr(task, "reward", None)
    fields = {f.name: f for f in dataclasses.fields(task)} if dataclasses.is_dataclass(task) else {}
    default = fields["reward"].default if "reward" in fields else None
    if reward is None or reward == default:
        return slug(task.kind)
    return f"{slug(task.kind)}_{slug(getattr(reward, 'value', str(reward)))}"


def with_seed(cfg, seed: int, sft_dir: pathlib.Path):
    """cfg for `seed`, its SFT warm start cached in sft_dir/<task>_seedS (shared by all
    arms), or in sft_dir/<task>_sft_seedX for every seed when the warm start's seed is fixed
    (sft.seed); the task (task_slug) keeps tables of different tasks apart in one --sft_dir."""
    name = f"seed{seed}" if cfg.sft.seed is None else f"sft_seed{cfg.sft.seed}"
    task = getattr(cfg, "task", None)  # test doubles of a config may have none
    if task is not None:
        name = f"{task_slug(task)}_{name}"
    sft = dataclasses.replace(cfg.sft, cache_dir=str(sft_dir / name))
    return dataclasses.replace(cfg, seed=seed, sft=sft)


def arm_config(table: Table, arm: Arm, seed: int, ctx: Context):
    """The TrainConfig of (arm, seed): the table's base, the seed, the arm, ctx.adjust."""
    return ctx.adjust(arm, arm.make(with_seed(table.base(seed, ctx.smoke), seed, ctx.sft_dir)))


def budget(cfg, steps: int, batch: int, samples: int):
    """cfg with `steps` RL steps of `batch` prompts x `samples` (schedule, evals adjusted)."""
    warmup = min(cfg.optimizer.warmup_steps, steps - 1)
    opt = dataclasses.replace(cfg.optimizer, total_steps=steps, warmup_steps=warmup)
    ev = dataclasses.replace(cfg.eval, every=max(1, steps // 2))
    ck = dataclasses.replace(cfg.checkpoint, every=max(1, steps // 2))
    return dataclasses.replace(cfg, steps=steps, batch_prompts=batch, samples=samples,
                               optimizer=opt, eval=ev, checkpoint=ck)  # fmt: skip


def design(cfg, steps: int, batch: int, samples: int, *, problems: int = 1000, n_eval: int = 32,
           validation: int = 500):  # fmt: skip
    """The tables' shared design (README, Results): budget(cfg, ...) plus one SFT warm start
    for every seed (sft.seed = 0: seeds vary only the RL, as a paper fine-tuning one base
    model does), `validation` train problems held out for tuning, and an evaluation of
    `problems` test problems x `n_eval` samples (eval noise well under the seed-to-seed
    spread)."""
    cfg = budget(cfg, steps, batch, samples)
    task = dataclasses.replace(
        cfg.task, test_size=max(cfg.task.test_size, problems), validation_size=validation
    )
    ev = dataclasses.replace(cfg.eval, problems=problems, n_eval=n_eval)
    return dataclasses.replace(cfg, task=task, eval=ev, sft=dataclasses.replace(cfg.sft, seed=0))


def smoke_base(cfg):
    """The --smoke budget: a 1-layer d=32 model, 2 RL steps of 8 x 8, 4 SFT steps, a tiny
    eval (16 problems x 16 samples), on 150 problems (arithmetic: 1-digit), 16 of them held
    out for tuning
    (design's shape). Same warm start for every module and seed,
    so tests can share one SFT_DIR. Only Table.smoke_arms train (CI time); the other arms'
    configs are built and validated."""
    m = dataclasses.replace(cfg.model, hidden_size=32, num_layers=1, num_heads=2,
                            num_kv_heads=1, intermediate_size=64)  # fmt: skip
    small = {"digits": 1} if hasattr(cfg.task, "digits") else {}  # arithmetic: 1-digit
    task = dataclasses.replace(cfg.task, train_size=150, test_size=16, validation_size=16,
                               **small)  # fmt: skip
    sft = dataclasses.replace(cfg.sft, steps=4, batch_size=8, seed=0)
    ev = dataclasses.replace(cfg.eval, n_eval=16, problems=16)
    tokens = 4 if small else cfg.max_new_tokens  # a countdown solution needs its length
    cfg = dataclasses.replace(cfg, model=m, task=task, sft=sft, eval=ev, max_new_tokens=tokens)
    return budget(cfg, 2, 8, 8)


def rl_execute(table: Table, arm: Arm, seed: int, run_dir: pathlib.Path, ctx: Context) -> dict:
    """One RL run of arm at seed: the first and the last evaluation, and the run's shape."""
    from kjax.rl.loop import train_and_evaluate

    cfg = dataclasses.replace(arm_config(table, arm, seed, ctx), name=slug(arm.name))
    last = train_and_evaluate(cfg, run_dir / "run", log=lambda *a, **k: None, progress=False)
    return run_metrics(cfg, run_dir, last)


def run_metrics(cfg, run_dir: pathlib.Path, last: dict) -> dict:
    """A finished RL run's result metrics: its last evaluation (keys without "eval/"), its
    first one (scope "start"), and the run's shape."""
    from kjax.evaluation import read_jsonl

    first = str(MetricKey("pass", 1, scope="eval"))
    rows = [r for r in read_jsonl(run_dir / "run" / "metrics.jsonl") if first in r]
    at_k = {key: MetricKey.find(key) for key in rows[0]}
    start = {
        str(dataclasses.replace(m, scope="start")): rows[0][key]
        for key, m in at_k.items()
        if m is not None
    }
    return {**{k.removeprefix("eval/"): v for k, v in last.items()}, **start,
            "steps": cfg.steps, "B": cfg.batch_prompts, "N": cfg.samples,
            "lr": cfg.optimizer.learning_rate}  # fmt: skip


def open_run(cfg, workdir: pathlib.Path, log=lambda *a, **k: None):
    """(kjax.rl.components.Components, params after the SFT warm start) of cfg in workdir,
    for measurements outside the RL loop; close the Components when done."""
    from kjax.rl.loop import build_components

    components, state = build_components(cfg, workdir, log=log)
    return components, state.params


def run_one(table: Table, arm: Arm, seed: int, ctx: Context) -> dict:
    """The result row of (arm, seed), from its result.json when already done. ArmFailed when
    the arm raises anything but FloatingPointError (a divergence: a "diverged" row)."""
    run_dir = ctx.workdir / ctx.runs / slug(arm.name) / f"seed{seed}"
    done = run_dir / "result.json"
    if done.exists():
        return _reuse(table, arm, seed, ctx, run_dir)
    if ctx.report_only:
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seed {seed} has no finished run in "
            f"{run_dir}; rerun without --report_only to train it."
        )
    try:
        row = _run(table, arm, seed, ctx, run_dir)
    except Exception as e:
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seed {seed} failed with "
            f"{type(e).__name__}: {e}"
        ) from e
    ctx.log(f"[{table.name}] {arm.name} seed {seed}: {row['status']} ({row['wall_s']} s)")
    return row


def fingerprint(cfg) -> str:
    """A short hash of a run's whole config (a dataclass), stored with its result."""
    import hashlib

    text = json.dumps(dataclasses.asdict(cfg), default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _reuse(table: Table, arm: Arm, seed: int, ctx: Context, run_dir: pathlib.Path) -> dict:
    """A finished run's row, when it was run with the config the table asks for now; a row
    from another config (e.g. a learning rate tuned again since, or a changed budget) is
    an error, never a result. Rows written before configs were fingerprinted are kept."""
    row = json.loads((run_dir / "result.json").read_text())
    stored = row.get("config_sha")
    if stored is not None and stored != fingerprint(arm_config(table, arm, seed, ctx)):
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seed {seed}: {run_dir} holds a finished "
            "run of another config (a learning rate tuned again, or a changed budget); delete "
            "that folder to rerun it, or use a new --workdir."
        )
    return row


def finished_by_config(workdirs: Sequence[pathlib.Path]) -> dict[str, pathlib.Path]:
    """{config_sha: result.json} of every finished run (reported or tuning) under the
    workdirs of other tables (--reuse_runs); the first workdir given wins a tie."""
    found: dict[str, pathlib.Path] = {}
    for workdir in workdirs:
        if not workdir.is_dir():
            raise FileNotFoundError(f"--reuse_runs={workdir}: no such folder")
        for path in sorted(workdir.glob("*/**/result.json")):
            row = json.loads(path.read_text())
            sha = row.get("config_sha")
            if sha and row.get("status") in ("ok", "diverged"):
                found.setdefault(sha, path)
    return found


_FINISHED: dict[tuple, dict[str, pathlib.Path]] = {}


def reused_row(table: Table, arm: Arm, seed: int, ctx: Context, sha: str) -> dict | None:
    """The row of a finished run of another table (ctx.reuse) whose whole config,
    fingerprinted, is this run's: the same training, so its result is this run's too
    (README: tables 1, 2 and 6 share their mean, LOO-1 and centred PG arms). It keeps the
    provenance of the process that trained it and says where it came from."""
    if not ctx.reuse:
        return None
    if ctx.reuse not in _FINISHED:  # scanned once per process; those tables are finished
        _FINISHED[ctx.reuse] = finished_by_config(ctx.reuse)
    path = _FINISHED[ctx.reuse].get(sha)
    if path is None:
        return None
    row = json.loads(path.read_text())
    return {**row, "table": table.name, "arm": arm.name, "seed": seed,
            "reused_from": str(path)}  # fmt: skip


def _run(table: Table, arm: Arm, seed: int, ctx: Context, run_dir: pathlib.Path) -> dict:
    row = {"table": table.name, "arm": arm.name, "seed": seed, "provenance": provenance()}
    if ctx.validate_only or (ctx.smoke and table.smoke_arms and arm.name not in table.smoke_arms):
        import jax  # keep CI short: the other arms' configs are built and validated only

        arm_config(table, arm, seed, ctx).validate(jax.device_count())
        return {**row, "status": SMOKE_SKIPPED, "metrics": {}, "wall_s": 0.0}
    import fcntl

    done = run_dir / "result.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "lock", "w") as lock:  # several workers may share one table
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {**row, "status": RUNNING, "metrics": {}, "wall_s": 0.0}
        if done.exists():  # another worker finished it meanwhile
            return _reuse(table, arm, seed, ctx, run_dir)
        row["config_sha"] = fingerprint(arm_config(table, arm, seed, ctx))
        reused = reused_row(table, arm, seed, ctx, row["config_sha"])
        if reused is not None:
            done.write_text(json.dumps(reused, indent=1))
            return reused
        start = time.time()
        try:
            metrics = (table.execute or rl_execute)(table, arm, seed, run_dir, ctx)
            finite = all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
            row.update(status="ok" if finite else "diverged", metrics=metrics)
        except FloatingPointError as e:
            row.update(status="diverged", metrics={}, error=str(e).splitlines()[0])
        row["wall_s"] = round(time.time() - start, 1)
        done.write_text(json.dumps(row, indent=1))
    return row


def warm_start(table: Table, seed: int, ctx: Context) -> None:
    """Builds seed's shared SFT warm start once, under a file lock, so that tables run in
    parallel with one --sft_dir never train the same warm start twice at the same time."""
    import fcntl

    cfg = with_seed(table.base(seed, ctx.smoke), seed, ctx.sft_dir)
    if not cfg.sft.steps:
        return
    name = pathlib.Path(cfg.sft.cache_dir).name
    ctx.sft_dir.mkdir(parents=True, exist_ok=True)
    with open(ctx.sft_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        handle = ctx.workdir / "runs" / "_warm_start" / f"seed{seed}"  # the base config's
        components, _ = open_run(cfg, handle, ctx.log)
        components.close()
        fcntl.flock(lock, fcntl.LOCK_UN)


def lockstep(table: Table, arm: Arm, seeds: Sequence[int], ctx: Context) -> None:
    """With ctx.lockstep = S >= 2, trains the seeds of arm that have no result yet S at a
    time in lockstep (kjax.rl.seeds.train_seeds: one compiled step for all of them) and
    leaves each one's result.json as run_one would; run_one then reuses them. Does
    nothing where lockstep does not apply: a table with its own execute, an arm a smoke
    run skips, validation or report-only contexts, fewer than two pending seeds, or a
    config train_seeds refuses (dynamic sampling, a verifier pool): run_one trains those
    one seed at a time."""
    if table.execute is not None or ctx.validate_only or ctx.report_only or ctx.lockstep < 2:
        return
    if ctx.smoke and table.smoke_arms and arm.name not in table.smoke_arms:
        return
    import fcntl

    from kjax.rl import seeds as seeds_lib

    pending = []
    for seed in seeds:
        run_dir = ctx.workdir / ctx.runs / slug(arm.name) / f"seed{seed}"
        asked = arm_config(table, arm, seed, ctx)
        cfg = dataclasses.replace(asked, name=slug(arm.name))
        reused = reused_row(table, arm, seed, ctx, fingerprint(asked))
        if not (run_dir / "result.json").exists() and not reused:
            pending.append((seed, run_dir, cfg))  # run_one takes the reused ones
    if len(pending) < 2 or seeds_lib.unsupported(pending[0][2]):
        return
    locks, mine = [], []
    try:
        for seed, run_dir, cfg in pending:
            run_dir.mkdir(parents=True, exist_ok=True)
            lock = open(run_dir / "lock", "w")  # noqa: SIM115 - held until the group ends
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another worker trains this seed
                lock.close()
                continue
            locks.append(lock)
            if not (run_dir / "result.json").exists():
                mine.append((seed, run_dir, cfg))
        for i in range(0, len(mine), ctx.lockstep):
            _lockstep_group(table, arm, mine[i : i + ctx.lockstep], ctx)
    finally:
        for lock in locks:
            lock.close()


def _lockstep_group(table: Table, arm: Arm, mine: list, ctx: Context) -> None:
    """Trains [(seed, run_dir, cfg)] in lockstep and writes each one's result.json."""
    from kjax.rl import seeds as seeds_lib

    if len(mine) < 2:  # run_one trains a lone seed
        return
    start = time.time()
    try:
        results = seeds_lib.train_seeds(
            [c for _, _, c in mine],
            [d / "run" for _, d, _ in mine],
            log=lambda *a, **k: None,
            progress=True,
        )
    except Exception as e:
        seeds = [s for s, _, _ in mine]
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seeds {seeds} (in lockstep) failed "
            f"with {type(e).__name__}: {e}"
        ) from e
    wall = round((time.time() - start) / len(mine), 1)  # each seed's share
    for (seed, run_dir, cfg), result in zip(mine, results, strict=True):
        row = {"table": table.name, "arm": arm.name, "seed": seed, "provenance": provenance(),
               "config_sha": fingerprint(arm_config(table, arm, seed, ctx)),
               "lockstep_seeds": len(mine), "wall_s": wall}  # fmt: skip
        if isinstance(result, FloatingPointError):
            row.update(status="diverged", metrics={}, error=str(result).splitlines()[0])
        else:
            metrics = run_metrics(cfg, run_dir, result)
            finite = all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
            row.update(status="ok" if finite else "diverged", metrics=metrics)
        (run_dir / "result.json").write_text(json.dumps(row, indent=1))
    ctx.log(f"[{table.name}] {arm.name}: {len(mine)} seeds in lockstep, {wall} s per seed")


def run_table(table: Table, seeds: Sequence[int], ctx: Context) -> list[dict]:
    for seed in seeds:  # every warm start first, built once and reused by every arm
        warm_start(table, seed, ctx)
    if ctx.lockstep >= 2 and table.execute is not None:
        ctx.log(f"[{table.name}] --lockstep does not apply: this table runs its own execute")
    for arm in table.arms:
        lockstep(table, arm, seeds, ctx)
    rows = []
    for seed in seeds:
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


def tune(table: Table, ctx: Context) -> tuple[dict[str, dict], list[dict]]:
    """Runs the table's Tuning grid (every arm x rate x tuning seed, scored on the
    validation split) and returns ({arm: {"metric", "grid", "scores", "lr"}}, its rows).
    Finished tuning runs are kept (WORKDIR/tuning/lrX/ARM/seedS) like any run. Under --smoke
    no tuning run trains (CI time): every grid point's config is built and validated, and
    each arm takes the grid's smallest rate."""
    t = table.tuning
    chosen, rows = {}, []
    if not (ctx.smoke or ctx.report_only):
        for seed in t.seeds:
            warm_start(table, seed, ctx)
    for arm in table.arms:
        metric = arm.select or tuning.OBJECTIVE
        scores = []
        for lr in t.grid:

            def adjust(a, c, lr=lr):
                return tuning.for_tuning(ctx.adjust(a, c), lr)

            at = dataclasses.replace(
                ctx, runs=f"tuning/lr{lr:g}", adjust=adjust, validate_only=ctx.smoke
            )
            lockstep(table, arm, t.seeds, at)
            mine = [{**run_one(table, arm, seed, at), "lr": lr} for seed in t.seeds]
            rows += mine
            trained = [r for r in mine if r["status"] != SMOKE_SKIPPED]
            scores.append(tuning.score(trained, metric) if trained else 0.0)
        chosen[arm.name] = {"metric": metric, "grid": list(t.grid), "scores": scores,
                            "lr": tuning.choose(t.grid, scores)}  # fmt: skip
        ctx.log(f"[{table.name}] {arm.name}: lr {chosen[arm.name]['lr']:g} by {metric}")
    return chosen, rows


def with_tuned_rates(ctx: Context, chosen: dict[str, dict]) -> Context:
    """ctx whose runs take each arm's chosen learning rate."""

    def adjust(arm, cfg):
        return tuning.with_learning_rate(ctx.adjust(arm, cfg), chosen[arm.name]["lr"])

    return dataclasses.replace(ctx, adjust=adjust)


def merge(table: Table, rows: list[dict], extra: dict) -> None:
    """Adds the per-seed measurements and the table's derived metrics to each row."""
    for row in rows:
        row["metrics"] = {**row["metrics"], **extra.get(row["arm"], {})}
        if table.derive is not None and row["status"] == "ok":
            row["metrics"].update(table.derive(row["metrics"]))


def parse(prog: str, argv=None, default_seeds: int = 5) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"experiments.{prog}")
    p.add_argument("--workdir", required=True, help="runs under WORKDIR/runs; outputs in WORKDIR")
    p.add_argument("--seeds", type=int, default=default_seeds,
                   help=f"seeds 0..SEEDS-1 (default {default_seeds})")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, tiny eval (CI)")
    p.add_argument("--sft_dir", default="", help="shared SFT warm starts (default WORKDIR/sft)")
    p.add_argument("--report_only", action="store_true",
                   help="train nothing: tabulate the seeds whose arms all finished")  # fmt: skip
    p.add_argument("--arms", default="",
                   help="comma-separated arm names: run (and judge) only these")  # fmt: skip
    p.add_argument("--learning_rates", default="",
                   help="take each arm's rate from this NAME.claims.json of a tuned run "
                        "instead of tuning again")  # fmt: skip
    p.add_argument("--lockstep", type=int, default=0, metavar="S",
                   help="train an arm's seeds S at a time in lockstep, one compiled step "
                        "over a seed axis (kjax.rl.seeds; the same runs up to float "
                        "rounding). Default 0: one seed at a time, which is faster on a "
                        "2-core CPU (BUILD.md, Paper tables)")  # fmt: skip
    p.add_argument("--reuse_runs", default="", metavar="DIR[,DIR]",
                   help="workdirs of other tables: a run (reported or tuning) whose whole "
                        "config matches one finished there takes its result instead of "
                        "training again (give those tables' --sft_dir too, so the warm "
                        "start is the same file)")  # fmt: skip
    p.add_argument("--from_rows", default="",
                   help="train nothing: judge the rows of this NAME.jsonl (e.g. a committed "
                        "result) under the table's current claims; outputs in WORKDIR")  # fmt: skip
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1; got {args.seeds}")
    if args.lockstep < 0:
        p.error(f"--lockstep must be >= 0 (0 or 1: one seed at a time); got {args.lockstep}")
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


def only_arms(table: Table, names: Sequence[str]) -> Table:
    """The table with only the named arms and the claims between them (--arms)."""
    known = [a.name for a in table.arms]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--arms: {unknown} are not arms of {table.name}; its arms: {known}")
    keep = set(names)
    claims_ = tuple(c for c in table.claims if c.arm in keep and c.baseline in (None, *keep))
    arms = tuple(a for a in table.arms if a.name in keep)
    smoke = tuple(a for a in table.smoke_arms if a in keep)
    return dataclasses.replace(table, arms=arms, claims=claims_, smoke_arms=smoke)


def tuned_rates(table: Table, path: pathlib.Path) -> dict[str, dict]:
    """The chosen rates of a tuned run's NAME.claims.json (--learning_rates), every arm's."""
    if not path.exists():
        raise FileNotFoundError(f"--learning_rates={path}: no such file")
    chosen = json.loads(path.read_text()).get("tuning", {}).get("chosen", {})
    missing = [a.name for a in table.arms if a.name not in chosen]
    if missing:
        raise ValueError(f"--learning_rates={path} has no tuned rate for the arms {missing}")
    return {a.name: chosen[a.name] for a in table.arms}


def rejudge(table: Table, path: pathlib.Path, out: pathlib.Path) -> int:
    """Writes the table's outputs from finished rows (a NAME.jsonl) without training: the
    table's derived metrics are recomputed and its current claims judged. The rows keep
    their own provenance (none, for rows written before it was recorded)."""
    if not path.exists():
        print(f"error: --from_rows={path}: no such file", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    merge(table, rows, {})
    seeds = sorted({r["seed"] for r in rows})
    text = write_outputs(table, rows, seeds, False, out)
    print(f"\n{text}\n{out}/{table.name}.{{md,jsonl,claims.json,png}} from {path}")
    return 0


def main(table: Table, argv=None, default_seeds: int = 5) -> int:
    args = parse(table.name, argv, default_seeds)
    workdir = pathlib.Path(args.workdir)
    setup_jax(workdir)
    seeds = [0] if args.smoke else list(range(args.seeds))
    sft_dir = pathlib.Path(args.sft_dir or workdir / "sft")
    reuse = tuple(pathlib.Path(d.strip()) for d in args.reuse_runs.split(",") if d.strip())
    ctx = Context(
        workdir,
        sft_dir,
        args.smoke,
        report_only=args.report_only,
        lockstep=args.lockstep,
        reuse=reuse,
    )
    start = time.time()
    missing = [str(d) for d in ctx.reuse if not d.is_dir()]
    if missing:
        print(f"error: --reuse_runs: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.from_rows:
        return rejudge(table, pathlib.Path(args.from_rows), workdir)
    chosen, tuning_rows = None, []
    try:
        if args.arms:
            table = only_arms(table, [a.strip() for a in args.arms.split(",")])
        if args.learning_rates:
            chosen = tuned_rates(table, pathlib.Path(args.learning_rates))
            ctx = with_tuned_rates(ctx, chosen)
        elif table.tuning is not None:  # before any reported run: nothing reported is tuned on
            chosen, tuning_rows = tune(table, ctx)
            ctx = with_tuned_rates(ctx, chosen)
        if args.report_only:
            rows, seeds = finished_rows(table, seeds, ctx)
        else:
            rows = run_table(table, seeds, ctx)
    except (ValueError, FileNotFoundError) as e:  # a bad --arms or --learning_rates
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ArmFailed as e:  # finished runs are kept; the table resumes after the fix
        if e.__cause__ is not None:
            traceback.print_exception(e.__cause__)
        print(f"error: {e}. No table was written; fix the arm and rerun.", file=sys.stderr)
        return 1
    text = write_outputs(table, rows, seeds, args.smoke, workdir, chosen, tuning_rows)
    print(
        f"\n{text}\nwall time of this invocation: {(time.time() - start) / 60:.1f} min; "
        f"{workdir}/{table.name}.{{md,jsonl,claims.json,png}}"
    )
    return 0
