"""The command line of a paper table: tune, run, report (python -m experiments.tables.NAME).

`main(table, argv)` parses the flags (--workdir, --seeds, --smoke, --sft_dir, --arms,
--learning_rates, --lockstep, --reuse_runs, --report_only, --from_rows, --status), tunes each arm's
learning rate by experiments.lab.tuning's protocol before any reported run (`tune`), runs the
arms x seeds (experiments.lab.table_runs), and writes NAME.{md,jsonl,claims.json,png} through
experiments.lab.report. Exit status: 0 written; 1 an arm failed (finished runs are kept, the
table resumes after the fix); 2 a bad flag, file or folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
import traceback
from collections.abc import Sequence

from experiments.lab import harness, tuning
from experiments.lab.harness import ArmFailed, Context, Table, slug
from experiments.lab.report import SMOKE_SKIPPED, write_outputs
from experiments.lab.table_runs import (
    lockstep,
    read_result,
    run_folder,
    run_one,
    run_table,
    smoke_skipped,
    warm_start,
)
from experiments.train import os_error


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
                ctx, runs=tuning.runs_folder(lr), adjust=adjust, validate_only=ctx.smoke
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


def parse(prog: str, argv=None, default_seeds: int = 5) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"{harness.TABLES_PACKAGE}.{prog}")
    p.add_argument("--workdir", required=True, help="runs under WORKDIR/runs; outputs in WORKDIR")
    p.add_argument("--seeds", type=int, default=default_seeds,
                   help=f"seeds 0..SEEDS-1 (default {default_seeds})")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, tiny eval (CI)")
    p.add_argument("--sft_dir", default="", help="shared SFT warm starts (default WORKDIR/sft)")
    p.add_argument("--report_only", action="store_true",
                   help="train nothing: tabulate the seeds whose arms all finished")  # fmt: skip
    p.add_argument("--arms", default="",
                   help="comma-separated arm names or slugs: run, judge only these")  # fmt: skip
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
    p.add_argument("--status", action="store_true",
                   help="train nothing: list every tuning and table run as done, "
                        "started or not started, and the hours left")  # fmt: skip
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
        trained = [a for a in table.arms if not smoke_skipped(table, a.name, ctx)]
        paths = [run_folder(ctx.workdir, "runs", a.name, seed) / "result.json" for a in trained]
        extra = ctx.workdir / "runs" / "_per_seed" / f"seed{seed}.json"
        if not all(p.exists() for p in paths) or (table.per_seed and not extra.exists()):
            break
        found = {a.name: read_result(p) for a, p in zip(trained, paths, strict=True)}
        # an arm a smoke run only validates is validated again, its row as that run's
        seed_rows = [found.get(a.name) or run_one(table, a, seed, ctx) for a in table.arms]
        harness.merge(table, seed_rows, json.loads(extra.read_text()) if table.per_seed else {})
        rows, done = rows + seed_rows, done + [seed]
    return rows, done


def arm_names(table: Table, text: str) -> list[str]:
    """--arms's comma-separated list as arm names. A name may itself hold commas (table 3's
    "3 epochs, linearised off-policy"), so pieces are joined until they name an arm; an arm
    may also be given by its slug (harness.slug: "3_epochs_linearised_off_policy")."""
    by_key = {k: a.name for a in table.arms for k in (a.name, slug(a.name))}
    names, piece = [], None
    for part in text.split(","):
        piece = part if piece is None else f"{piece},{part}"
        if piece.strip() in by_key:
            names.append(by_key[piece.strip()])
            piece = None
    if piece is not None:  # no arm: only_arms names the unknown ones and the table's arms
        names += [by_key.get(p.strip(), p.strip()) for p in piece.split(",") if p.strip()]
    return names


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


def _tuning_beside(table: Table, rows: pathlib.Path) -> tuple[dict | None, list[dict]]:
    """The tuning a rows file was written with: the chosen rates of the NAME.claims.json and
    the rows of the NAME.tuning.jsonl beside it ((None, []) when either is missing), so a
    table judged again keeps its learning-rate section."""
    claims_path = rows.with_name(f"{table.name}.claims.json")
    tuning_path = rows.with_name(f"{table.name}.tuning.jsonl")
    if table.tuning is None or not (claims_path.exists() and tuning_path.exists()):
        return None, []
    chosen = json.loads(claims_path.read_text()).get("tuning", {}).get("chosen")
    lines = tuning_path.read_text().splitlines()
    return (chosen, [json.loads(line) for line in lines if line.strip()]) if chosen else (None, [])


def rejudge(table: Table, path: pathlib.Path, out: pathlib.Path) -> int:
    """Writes the table's outputs from finished rows (a NAME.jsonl) without training: the
    table's derived metrics are recomputed and its current claims judged. The rows keep
    their own provenance (none, for rows written before it was recorded)."""
    if not path.is_file():
        print(f"error: --from_rows={path}: no such file (a NAME.jsonl of rows)", file=sys.stderr)
        return 2
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        print(f"error: --from_rows={path}: not JSON lines ({e}); give a NAME.jsonl of rows.",
              file=sys.stderr)  # fmt: skip
        return 2
    harness.merge(table, rows, {})
    seeds = sorted({r["seed"] for r in rows})
    chosen, tuning_rows = _tuning_beside(table, path)
    text = write_outputs(table, rows, seeds, False, out, chosen, tuning_rows)
    print(f"\n{text}\n{out}/{table.name}.{{md,jsonl,claims.json,png}} from {path}")
    return 0


def main(table: Table, argv=None, default_seeds: int = 5) -> int:
    args = parse(table.name, argv, default_seeds)
    workdir = pathlib.Path(args.workdir)
    seeds = [0] if args.smoke else list(range(args.seeds))
    if args.status:
        from experiments.lab.table_status import status

        print(status(table, workdir, seeds))
        return 0
    setup_jax(workdir)
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
        from kjax.rl import multihost

        multihost.device_count()  # JAX_PLATFORMS naming a backend this machine lacks
        if args.arms:
            table = only_arms(table, arm_names(table, args.arms))
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
        print(f"error: {str(e).rstrip('.')}.", file=sys.stderr)
        return 2
    except ArmFailed as e:  # finished runs are kept; the table resumes after the fix
        cause = e.__cause__
        if isinstance(cause, OSError) and os_error(cause, workdir).startswith("--workdir"):
            print(f"error: {os_error(cause, workdir)}", file=sys.stderr)  # not the arm's fault
            return 2
        if cause is not None and not isinstance(cause, ValueError):
            traceback.print_exception(cause)  # a bug's traceback; a user's error is its message
        print(f"error: {str(e).rstrip('.')}. No table was written; fix the arm and rerun.",
              file=sys.stderr)  # fmt: skip
        return 1
    except OSError as e:  # a workdir that cannot be written
        print(f"error: {os_error(e, workdir)}", file=sys.stderr)
        return 2
    try:
        text = write_outputs(table, rows, seeds, args.smoke, workdir, chosen, tuning_rows)
    except OSError as e:
        print(f"error: {os_error(e, workdir)}", file=sys.stderr)
        return 2
    print(
        f"\n{text}\nwall time of this invocation: {(time.time() - start) / 60:.1f} min; "
        f"{workdir}/{table.name}.{{md,jsonl,claims.json,png}}"
    )
    return 0
