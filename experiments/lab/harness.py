"""Declaring a paper table: its arms, claims and the shared experimental design.

A table module declares a `Table` (arms, claims written before running, the metric
columns, a base config per seed) and runs it with `experiments.lab.table_cli.main(table, argv)`.
This module holds what a table declares and what every run of it shares: the design
(`design`, `budget`, `smoke_base`), each (arm, seed)'s config (`with_seed`, `arm_config`,
the warm start's folder), a config's fingerprint, and one RL run (`rl_execute`).

How the arms x seeds are run, resumed and reused: experiments.lab.table_runs. Tuning and the
command line: experiments.lab.table_cli. Statistics (per-arm intervals, paired claims, Holm,
TOST, MDE): experiments.lab.claims. Provenance of every row and table: experiments.lab.provenance.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import re
from collections.abc import Callable

from experiments.lab.claims import Claim, MetricKey
from experiments.lab.tuning import Tuning
from kjax.lora_config import LoraConfig


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
    tuning: Tuning | None = None  # each arm's learning rate by experiments.lab.tuning's protocol


# Where the tables live. The lab names no table: its command-line tools (compare, power,
# findings, bench_tables) take one by its module name, e.g. tang2025_table.
TABLES_PACKAGE = "experiments.tables"


def load_table(name: str) -> Table:
    """The TABLE that experiments/tables/NAME.py declares (name: its module, e.g.
    "tang2025_table")."""
    return importlib.import_module(f"{TABLES_PACKAGE}.{name}").TABLE


def _as_is(arm, cfg):
    return cfg


def _print_flushed(*args, **kwargs) -> None:
    """print, flushed: a table's lines reach a log file (`... > table.log`) as they are
    written, not when the buffer fills, hours into a long table."""
    print(*args, **kwargs, flush=True)


@dataclasses.dataclass(frozen=True)
class Context:
    """workdir, sft_dir, smoke: from the command line. runs: the folder of WORKDIR the
    runs go in. adjust(arm, cfg) -> cfg: the last change to every run's config (a tuning
    run's rate and split, or the rate tuning chose)."""

    workdir: pathlib.Path
    sft_dir: pathlib.Path
    smoke: bool
    log: Callable = _print_flushed
    runs: str = "runs"
    adjust: Callable = _as_is
    validate_only: bool = False  # build and validate every arm's config, train none
    report_only: bool = False  # train nothing: a run not finished is an error (tuning)
    lockstep: int = 0  # >= 2: an arm's pending seeds train in groups of this many together
    reuse: tuple[pathlib.Path, ...] = ()  # other tables' workdirs whose identical runs count


class ArmFailed(RuntimeError):
    """An arm raised while being built or run (not a divergence): a bug, never a result."""


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
    """The tables' shared design (docs/results.md, The design): budget(cfg, ...) plus one
    SFT warm start for every seed (sft.seed = 0: seeds vary only the RL, as a paper
    fine-tuning one base model does), `validation` train problems held out for tuning, and
    an evaluation of `problems` test problems x `n_eval` samples (eval noise well under the
    seed-to-seed spread)."""
    cfg = budget(cfg, steps, batch, samples)
    task = dataclasses.replace(
        cfg.task, test_size=max(cfg.task.test_size, problems), validation_size=validation
    )
    ev = dataclasses.replace(cfg.eval, problems=problems, n_eval=n_eval)
    return dataclasses.replace(cfg, task=task, eval=ev, sft=dataclasses.replace(cfg.sft, seed=0))


def smoke_base(cfg):
    """The --smoke budget: a 1-layer d=32 model, 2 RL steps of 8 x 8, 4 SFT steps, a tiny
    eval (16 problems x 16 samples) at the start and the end only, one checkpoint (the
    last step), on 150 problems (arithmetic: 1-digit), 16 of them held out for tuning
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
    cfg = budget(cfg, 2, 8, 8)
    # budget's mid-run evaluation and checkpoint (at step 1) repeat the end's: CI time
    ev = dataclasses.replace(cfg.eval, every=cfg.steps)
    ck = dataclasses.replace(cfg.checkpoint, every=cfg.steps)
    return dataclasses.replace(cfg, eval=ev, checkpoint=ck)


START_EVALS = "_start_evals"  # WORKDIR/START_EVALS: the runs' shared start draws


def rl_execute(table: Table, arm: Arm, seed: int, run_dir: pathlib.Path, ctx: Context) -> dict:
    """One RL run of arm at seed: the first and the last evaluation, and the run's shape.
    The runs of a table that start alike share their first evaluation's draw: the arms of
    a seed, and a tuning seed's runs at every rate of the grid (one WORKDIR/_start_evals,
    salted with the digest of the source and of jax's version, so an edit draws anew,
    committed or not; kjax.rl.start_evals)."""
    from experiments.lab.provenance import code_digest
    from kjax.rl.loop import train_and_evaluate
    from kjax.rl.start_evals import StartEvals

    cfg = dataclasses.replace(arm_config(table, arm, seed, ctx), name=slug(arm.name))
    shared = StartEvals(ctx.workdir / START_EVALS, salt=code_digest())
    last = train_and_evaluate(cfg, run_dir / "run", log=lambda *a, **k: None, progress=False,
                              start_evals=shared)  # fmt: skip
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


# TrainConfig fields (dotted paths) added after rows were fingerprinted, with the value
# that runs what those rows ran: left out of the hash at that value, so finished rows stay
# reusable. As dataclasses.asdict holds them (enum members, nested dicts).
_LATER_DEFAULTS = {
    "sampler_compact_floor": 0,  # the static sampler (kjax.sampling)
    "sampler_weights": "AUTO",  # the trainer's layout on CPUs (kjax.sampler_layout)
    "rl.pack": "OFF",  # the padded update (kjax.rl.packing)
    "rl.sequence_parallel": False,  # the residual stream whole over tensor (kjax.sharding)
    "model.attention": "AUTO",  # jnp on CPU (kjax.models.attention)
    "model.lora": dataclasses.asdict(LoraConfig()),  # full fine-tuning (kjax.models.lora)
    "objective.bon_anchor": "GROUP",  # BON_DISTILL's moving anchor (kjax.rl.objective_config)
    "objective.bon_anchor_samples": 0,
}
# Fields added before the ones above, after some committed rows were written (tables 10b,
# 1-3 of 2026-12-04/05 predate them) but before others (table 11 holds them): a row
# matches with these in the hash (at whatever value) or, at these values, without them.
_OLDER_DEFAULTS = {
    "mesh.sampler_devices": 0,  # the sampler on the update's devices
    "rl.policy_lag": 0,  # on-policy
    "rl.lag_correction": "NONE",
}


def _drop_later_defaults(fields: dict, defaults: dict = _LATER_DEFAULTS) -> None:
    for path, default in defaults.items():
        *parents, name = path.split(".")
        group = fields
        for p in parents:
            group = group.get(p) if isinstance(group, dict) else None
        if not isinstance(group, dict) or name not in group:
            continue
        value = group[name]
        if getattr(value, "name", value) == default or value == default:
            del group[name]


def fingerprint(cfg, workdir: pathlib.Path | None = None, *, older: bool = False) -> str:
    """A short hash of a run's whole config (a dataclass), stored with its result. Given the
    table's workdir, the warm start's folder (sft.cache_dir) counts relative to it when
    inside it (absolute otherwise): how the workdir is spelled (relative, absolute), moved
    or copied is no part of a run, while a warm start in another folder still is. Without
    a workdir: the hash of rows written before, with the folder as this process spells it.
    older: also without _OLDER_DEFAULTS' fields at their values (rows written before them)."""
    import hashlib

    fields = dataclasses.asdict(cfg)
    _drop_later_defaults(fields)  # at their defaults: what the stored rows ran
    if older:
        _drop_later_defaults(fields, _OLDER_DEFAULTS)
    sft = fields.get("sft")
    if workdir is not None and isinstance(sft, dict) and sft.get("cache_dir"):
        folder = pathlib.Path(os.path.abspath(sft["cache_dir"]))
        top = pathlib.Path(os.path.abspath(workdir))
        inside = folder.is_relative_to(top)
        sft["cache_dir"] = f"WORKDIR/{folder.relative_to(top)}" if inside else str(folder)
    text = json.dumps(fields, default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def merge(table: Table, rows: list[dict], extra: dict) -> None:
    """Adds the per-seed measurements and the table's derived metrics to each row."""
    for row in rows:
        row["metrics"] = {**row["metrics"], **extra.get(row["arm"], {})}
        if table.derive is not None and row["status"] == "ok":
            row["metrics"].update(table.derive(row["metrics"]))
