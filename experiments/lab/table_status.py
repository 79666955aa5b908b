"""--status: where a table that runs over several sessions stands, read from its folders
alone (nothing is trained, JAX is not started): each tuning and reported run as done (its
status and wall time), stopped or running at step i of its steps, or not started; each
arm's tuning scores so far; and the hours left at the finished runs' mean wall time.

  python -m experiments.tables.NAME --workdir=DIR [--seeds=S] --status
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

from experiments.lab import tuning
from experiments.lab.harness import Table
from experiments.lab.table_runs import TornResult, read_result, run_folder
from experiments.lab.tuning import OBJECTIVE, runs_folder
from kjax.files import read_jsonl


def run_state(run_dir: pathlib.Path, steps: int) -> tuple[str, float | None]:
    """(what the folder of one (arm, seed) holds, its wall seconds when finished)."""
    done = run_dir / "result.json"
    if done.exists():
        try:
            row = read_result(done)
        except TornResult:
            return "torn result.json (redone on the next run)", None
        return f"{row['status']}, {row['wall_s'] / 60:.1f} min", float(row["wall_s"])
    rows = read_jsonl(run_dir / "run" / "metrics.jsonl")  # harness.rl_execute's layout
    step = max((int(r.get("step", -1)) for r in rows), default=-1)
    if step >= 0:
        return f"started: step {step} of {steps}", None
    if (run_dir / "run").is_dir():
        return "started: no step logged yet (the start evaluation comes first)", None
    return "not started", None


def _runs(table: Table, workdir: pathlib.Path, seeds: Sequence[int]):
    """(stage, arm, seed, folder) of every run the table trains, in the order it trains
    them: the tuning grid (experiments.lab.tuning), then the reported seeds."""
    t = table.tuning
    if t is not None:
        for arm in table.arms:
            for lr in t.grid:
                for seed in t.seeds:
                    folder = run_folder(workdir, runs_folder(lr), arm.name, seed)
                    yield f"tuning, lr {lr:g}", arm.name, seed, folder
    for arm in table.arms:
        for seed in seeds:
            yield "table", arm.name, seed, run_folder(workdir, "runs", arm.name, seed)


def tuning_so_far(table: Table, workdir: pathlib.Path) -> list[str]:
    """Per arm, each rate's score over its finished tuning seeds (tuning.score: the mean
    validation objective; none when one diverged or has no objective) and the rate
    tuning.choose would take from them: the choice a finished grid would make can be seen
    before the grid ends. [] for a table without tuning."""
    t = table.tuning
    if t is None:
        return []
    lines = [f"Tuning so far (validation {OBJECTIVE}, mean over the finished tuning seeds):"]
    for arm in table.arms:
        rates, scores, cells = [], [], []
        for lr in t.grid:
            found = (_finished(run_folder(workdir, runs_folder(lr), arm.name, s)) for s in t.seeds)
            rows = [{"metrics": {}, **r} for r in found if r is not None]
            if rows:
                score = tuning.score(rows, OBJECTIVE)
                rates.append(lr)
                scores.append(score)
                shown = "no score" if score == -math.inf else f"{score:.3f}"  # diverged
                cells.append(f"lr {lr:g} {shown} ({len(rows)} of {len(t.seeds)} seeds)")
        leading = ""
        if any(sc > -math.inf for sc in scores):
            leading = f"; leading: lr {tuning.choose(rates, scores):g}"
        lines.append(f"- {arm.name}: {', '.join(cells) or 'none finished'}{leading}")
    return lines


def _finished(run_dir: pathlib.Path) -> dict | None:
    """The row of a finished run (its result.json), None when unfinished or torn."""
    done = run_dir / "result.json"
    try:
        return read_result(done) if done.exists() else None
    except TornResult:
        return None


def status(table: Table, workdir: pathlib.Path, seeds: Sequence[int]) -> str:
    """The --status text: one line per run, then the totals."""
    steps = table.base(0, False).steps
    lines = [f"{table.name} in {workdir}: {len(seeds)} seeds", "",
             "| stage | arm | seed | state |", "|---|---|---|---|"]  # fmt: skip
    walls, left = [], 0
    for stage, arm, seed, folder in _runs(table, workdir, seeds):
        state, wall = run_state(folder, steps)
        lines.append(f"| {stage} | {arm} | {seed} | {state} |")
        if wall is None:
            left += 1
        else:
            walls.append(wall)
    total = len(walls) + left
    lines.append("")
    if table.tuning is not None:
        lines += [*tuning_so_far(table, workdir), ""]
    if not walls:
        lines.append(f"finished 0 of {total} runs; no wall time measured yet")
        return "\n".join(lines)
    mean = sum(walls) / len(walls)
    lines.append(
        f"finished {len(walls)} of {total} runs, {sum(walls) / 3600:.1f} h of wall time "
        f"(mean {mean / 60:.1f} min a run); {left} to go: about {left * mean / 3600:.1f} h at "
        "that mean (a projection: runs that share a start evaluation, or that --reuse_runs "
        "takes over, take less)"
    )
    return "\n".join(lines)
