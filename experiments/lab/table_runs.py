"""Running a table's arms x seeds: train, resume, reuse, and tabulate the rows.

Each (arm, seed) trains in its own workdir WORKDIR/runs/ARM/seedS through the table's
execute (default `harness.rl_execute`: `kjax.rl.loop.train_and_evaluate`), or, with
--lockstep=S, S of an arm's pending seeds at a time through `kjax.rl.seeds.train_seeds`
(the same runs in lockstep under one compiled step). A finished run leaves a `result.json`
with its config's fingerprint, so an interrupted table resumes and finished runs are
skipped; a run of another config in that folder is an error, and --reuse_runs takes an
identical finished run of another table. Every arm of a seed warm-starts from the same SFT
checkpoint (SFT_DIR/<task>_seedS, shared through SFTConfig.cache_dir, built once under a
file lock) and is evaluated on the same held-out problems with the same sample count.
Runs of one process that differ only in their seed share one compiled update
(kjax.rl.components), so a table compiles each arm's step once.

Diverged runs (non-finite loss, FloatingPointError) are rows with status "diverged": counted
in the table, left out of differences. Any other exception of an arm stops the table
(ArmFailed names arm and seed; the CLI exits 1): a broken arm is never a result. Every row
records the provenance() of the process that ran it, and its wall time: for a run trained
alone, over every process that trained it (`run_wall`: a run resumed after a crash or a
session's end counts the interrupted processes too); for seeds in lockstep, its share of
the last process that trained the group.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from collections.abc import Sequence

from experiments.lab import harness
from experiments.lab.harness import Arm, ArmFailed, Context, Table, arm_config, fingerprint, slug
from experiments.lab.provenance import provenance
from experiments.lab.report import RUNNING, SMOKE_SKIPPED
from kjax.files import read_jsonl, write_atomic


def run_folder(workdir: pathlib.Path, runs: str, arm: str, seed: int) -> pathlib.Path:
    """The folder of arm's run at seed: WORKDIR/RUNS/ARM/seedS (runs: "runs", or a tuning
    rate's folder, experiments.lab.tuning.runs_folder)."""
    return workdir / runs / slug(arm) / f"seed{seed}"


def run_one(table: Table, arm: Arm, seed: int, ctx: Context) -> dict:
    """The result row of (arm, seed), from its result.json when already done. ArmFailed when
    the arm raises anything but FloatingPointError (a divergence: a "diverged" row)."""
    run_dir = run_folder(ctx.workdir, ctx.runs, arm.name, seed)
    try:
        row = _reuse(table, arm, seed, ctx, run_dir)
        if row is not None:
            return row
        if _must_be_finished(table, arm, ctx):
            raise ArmFailed(
                f"table {table.name}: arm {arm.name!r} at seed {seed} has no finished run in "
                f"{run_dir}; rerun without --report_only to train it"
            )
        row = _run(table, arm, seed, ctx, run_dir)
    except ArmFailed:
        raise
    except Exception as e:
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seed {seed} failed with "
            f"{type(e).__name__}: {e}"
        ) from e
    reason = f": {row['error']}" if row.get("error") else ""
    ctx.log(f"[{table.name}] {arm.name} seed {seed}: {row['status']} ({row['wall_s']} s){reason}")
    return row


def smoke_skipped(table: Table, arm: str, ctx: Context) -> bool:
    """Whether --smoke builds and validates the arm without training it (Table.smoke_arms)."""
    return ctx.smoke and bool(table.smoke_arms) and arm not in table.smoke_arms


def _must_be_finished(table: Table, arm: Arm, ctx: Context) -> bool:
    """Under --report_only, a run that would train must have finished (one a smoke run
    only validates never trains)."""
    return ctx.report_only and not (ctx.validate_only or smoke_skipped(table, arm.name, ctx))


class TornResult(ValueError):
    """A result.json that is not JSON: written by a kjax that did not write it atomically,
    and killed mid-write."""


ATTEMPTS = "attempts.jsonl"  # one line per process that trained a run: its start, its end


def _last_write(run_dir: pathlib.Path) -> float:
    """The newest modification time of a file the run wrote under run_dir (the trainer
    appends its metrics every step), or 0 before it wrote any."""
    times = [p.stat().st_mtime for p in run_dir.rglob("*")
             if p.is_file() and p.name not in (ATTEMPTS, "lock")]  # fmt: skip
    return max(times, default=0.0)


def begin_attempt(run_dir: pathlib.Path, now: float | None = None) -> None:
    """Records a process's start of run_dir's run in run_dir/attempts.jsonl. A previous
    attempt without an end was interrupted (kill, crash, a session's end): its end is the
    last write it left under run_dir, read now, before this process writes anything."""
    now = time.time() if now is None else now
    attempts = read_jsonl(run_dir / ATTEMPTS)
    if attempts and "end" not in attempts[-1]:
        attempts[-1]["end"] = max(attempts[-1]["start"], _last_write(run_dir))
    attempts.append({"start": now})
    write_atomic(run_dir / ATTEMPTS, "".join(json.dumps(a) + "\n" for a in attempts))


def run_wall(run_dir: pathlib.Path, now: float | None = None) -> tuple[float, int]:
    """(seconds, processes): the run's wall time summed over every process that trained it,
    the last one (the caller, begun with `begin_attempt`) counted up to now. An interrupted
    process counts up to its last write, so the work it lost after that is left out."""
    now = time.time() if now is None else now
    attempts = read_jsonl(run_dir / ATTEMPTS)
    total = sum(a.get("end", now) - a["start"] for a in attempts)
    return round(total, 1), len(attempts)


def read_result(path: pathlib.Path) -> dict:
    """A finished run's row (its result.json); TornResult names the file and the fix."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TornResult(
            f"{path} is torn ({e}): its run finished but was killed while writing it; delete "
            "it and rerun without --report_only (the run resumes from its last checkpoint)"
        ) from None


def write_result(path: pathlib.Path, row: dict) -> None:
    """result.json, atomically: a kill leaves the finished row or none, never a torn one."""
    write_atomic(path, json.dumps(row, indent=1))


def matches(stored: str, cfg, workdir: pathlib.Path) -> bool:
    """Whether a row's config_sha is cfg's in this workdir: its fingerprint, or the one of
    rows written before fingerprints were independent of the workdir's spelling, each also
    as rows written before harness._OLDER_DEFAULTS' fields existed hashed it."""
    return any(
        stored == fingerprint(cfg, wd, older=older) for wd in (workdir, None) for older in (0, 1)
    )


def _reuse(table: Table, arm: Arm, seed: int, ctx: Context, run_dir: pathlib.Path) -> dict | None:
    """A finished run's row, when it was run with the config the table asks for now; a row
    from another config (e.g. a learning rate tuned again since, or a changed budget) is
    an error, never a result. Rows written before configs were fingerprinted are kept.
    None when the run has not finished, or its result.json is torn (set aside as
    result.json.torn: the run is redone from its checkpoints)."""
    done = run_dir / "result.json"
    if not done.exists():
        return None
    try:
        row = read_result(done)
    except TornResult as e:
        if _must_be_finished(table, arm, ctx):
            raise ArmFailed(f"table {table.name}: arm {arm.name!r} at seed {seed}: {e}") from None
        done.replace(done.with_name("result.json.torn"))
        ctx.log(f"[{table.name}] {e}; set aside as result.json.torn, redoing the run")
        return None
    stored = row.get("config_sha")
    if stored is not None and not matches(stored, arm_config(table, arm, seed, ctx), ctx.workdir):
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seed {seed}: {run_dir} holds a finished "
            "run of another config (a learning rate tuned again, or a changed budget); delete "
            "that folder to rerun it, or use a new --workdir"
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
            try:
                row = read_result(path)
            except TornResult:
                continue  # not a finished result: that run trains here instead
            sha = row.get("config_sha")
            if sha and row.get("status") in ("ok", "diverged"):
                found.setdefault(sha, path)
    return found


_FINISHED: dict[pathlib.Path, dict[str, pathlib.Path]] = {}


def reused_row(table: Table, arm: Arm, seed: int, ctx: Context) -> dict | None:
    """The row of a finished run of another table (ctx.reuse) whose whole config,
    fingerprinted, is this run's: the same training, so its result is this run's too
    (tables 1, 2 and 6 share their mean, LOO-1 and centred PG arms). It keeps the
    provenance of the process that trained it and says where it came from. The config is
    fingerprinted as that table's workdir sees it, so only the same warm-start folder
    matches (the first workdir given wins a tie)."""
    cfg = arm_config(table, arm, seed, ctx) if ctx.reuse else None
    for workdir in ctx.reuse:
        if workdir not in _FINISHED:  # scanned once per process; those tables are finished
            _FINISHED[workdir] = finished_by_config([workdir])
        found = _FINISHED[workdir]
        # rows written before fingerprints took the workdir have the plain one
        path = found.get(fingerprint(cfg, workdir)) or found.get(fingerprint(cfg))
        if path is not None:
            row = json.loads(path.read_text())
            return {**row, "table": table.name, "arm": arm.name, "seed": seed,
                    "config_sha": fingerprint(cfg, ctx.workdir),  # as this table sees it
                    "reused_from": str(path)}  # fmt: skip
    return None


def _run(table: Table, arm: Arm, seed: int, ctx: Context, run_dir: pathlib.Path) -> dict:
    row = {"table": table.name, "arm": arm.name, "seed": seed, "provenance": provenance()}
    if ctx.validate_only or smoke_skipped(table, arm.name, ctx):
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
        finished = _reuse(table, arm, seed, ctx, run_dir)  # another worker finished it
        if finished is not None:
            return finished
        row["config_sha"] = fingerprint(arm_config(table, arm, seed, ctx), ctx.workdir)
        reused = reused_row(table, arm, seed, ctx)
        if reused is not None:
            write_result(done, reused)
            return reused
        ckpts = run_dir / "run" / "checkpoints"  # rl_execute's layout
        resumed = " (from its last checkpoint)" if ckpts.is_dir() and any(ckpts.iterdir()) else ""
        ctx.log(f"[{table.name}] {arm.name} seed {seed}: training{resumed} in {run_dir}, "
                f"started {time.strftime('%Y-%m-%d %H:%M:%S')}")  # fmt: skip
        begin_attempt(run_dir)
        try:
            metrics = (table.execute or harness.rl_execute)(table, arm, seed, run_dir, ctx)
            finite = all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
            row.update(status="ok" if finite else "diverged", metrics=metrics)
        except FloatingPointError as e:
            row.update(status="diverged", metrics={}, error=str(e).splitlines()[0])
        row["wall_s"], row["processes"] = run_wall(run_dir)
        write_result(done, row)
    return row


def warm_start(table: Table, seed: int, ctx: Context) -> None:
    """Builds seed's shared SFT warm start once, under a file lock, so that tables run in
    parallel with one --sft_dir never train the same warm start twice at the same time."""
    import fcntl

    from kjax.rl.components import warm_start_cached

    cfg = harness.with_seed(table.base(seed, ctx.smoke), seed, ctx.sft_dir)
    if not cfg.sft.steps:
        return
    name = pathlib.Path(cfg.sft.cache_dir).name
    ctx.sft_dir.mkdir(parents=True, exist_ok=True)
    with open(ctx.sft_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if warm_start_cached(cfg):  # another table (or worker) built it: nothing to train
            return
        handle = ctx.workdir / "runs" / "_warm_start" / f"seed{seed}"  # the base config's
        components, _ = harness.open_run(cfg, handle, ctx.log)
        components.close()
        fcntl.flock(lock, fcntl.LOCK_UN)


def lockstep(table: Table, arm: Arm, seeds: Sequence[int], ctx: Context) -> None:
    """With ctx.lockstep = S >= 2, trains the seeds of arm that have no result yet S at a
    time in lockstep (kjax.rl.seeds.train_seeds: one compiled step for all of them) and
    leaves each one's result.json as run_one would; run_one then reuses them. Does
    nothing where lockstep does not apply: a table with its own execute, an arm a smoke
    run skips, validation or report-only contexts, fewer than two pending seeds, or a
    config train_seeds refuses (dynamic sampling, a verifier pool): run_one trains those
    one seed at a time. An arm that raises (built or trained) is an ArmFailed naming it."""
    try:
        _lockstep(table, arm, seeds, ctx)
    except ArmFailed:
        raise
    except Exception as e:
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seeds {list(seeds)} (in lockstep) failed "
            f"with {type(e).__name__}: {e}"
        ) from e


def _lockstep(table: Table, arm: Arm, seeds: Sequence[int], ctx: Context) -> None:
    if table.execute is not None or ctx.validate_only or ctx.report_only or ctx.lockstep < 2:
        return
    if smoke_skipped(table, arm.name, ctx):
        return
    import fcntl

    from kjax.rl import seeds as seeds_lib

    pending = []
    for seed in seeds:
        run_dir = run_folder(ctx.workdir, ctx.runs, arm.name, seed)
        asked = arm_config(table, arm, seed, ctx)
        cfg = dataclasses.replace(asked, name=slug(arm.name))
        reused = reused_row(table, arm, seed, ctx)
        if not (run_dir / "result.json").exists() and not reused:
            pending.append((seed, run_dir, cfg))  # run_one takes the reused ones
    if len(pending) < 2:
        return
    why = seeds_lib.unsupported(pending[0][2])
    if why:  # said, not silently ignored: these seeds train one at a time
        ctx.log(f"[{table.name}] --lockstep={ctx.lockstep} does not apply to arm {arm.name!r}: "
                f"{why.rstrip('.')}; its seeds train one at a time.")  # fmt: skip
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
               "config_sha": fingerprint(arm_config(table, arm, seed, ctx), ctx.workdir),
               "lockstep_seeds": len(mine), "wall_s": wall}  # fmt: skip
        if isinstance(result, FloatingPointError):
            row.update(status="diverged", metrics={}, error=str(result).splitlines()[0])
        else:
            metrics = harness.run_metrics(cfg, run_dir, result)
            finite = all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
            row.update(status="ok" if finite else "diverged", metrics=metrics)
        write_result(run_dir / "result.json", row)
    ctx.log(f"[{table.name}] {arm.name}: {len(mine)} seeds in lockstep, {wall} s per seed")


def run_table(table: Table, seeds: Sequence[int], ctx: Context) -> list[dict]:
    for seed in seeds:  # every warm start first, built once and reused by every arm
        warm_start(table, seed, ctx)
    if ctx.lockstep >= 2 and table.execute is not None:
        ctx.log(f"[{table.name}] --lockstep does not apply: this table runs its own execute")
    for arm in table.arms:
        lockstep(table, arm, seeds, ctx)
    by_seed = {seed: [run_one(table, arm, seed, ctx) for arm in table.arms] for seed in seeds}
    rows = []
    for seed in seeds:
        # after every run of this worker: what other workers finished meanwhile is shown
        seed_rows = finished_since(by_seed[seed], ctx)
        extra = {}
        if table.per_seed is not None:
            extra_path = ctx.workdir / "runs" / "_per_seed" / f"seed{seed}.json"
            if not extra_path.exists():
                extra_path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(extra_path, json.dumps(table.per_seed(table, seed, ctx), indent=1))
            extra = json.loads(extra_path.read_text())
        harness.merge(table, seed_rows, extra)
        rows += seed_rows
    return rows


def finished_since(rows: list[dict], ctx: Context) -> list[dict]:
    """rows with each one another worker was running replaced by its result, when that
    worker has finished it since: the last worker to finish writes the whole table."""
    out = []
    for row in rows:
        done = ctx.workdir / ctx.runs / slug(row["arm"]) / f"seed{row['seed']}" / "result.json"
        if row["status"] == RUNNING and done.exists():
            try:
                row = {**read_result(done), **{k: row[k] for k in ("table", "arm", "seed")}}
            except TornResult:
                pass  # being written: still running
        out.append(row)
    return out
