"""The learning-rate protocol of the tables: each arm's rate, chosen before any reported run.

A table with a `Tuning` trains every arm at every learning rate of `grid` on the tuning
seeds (disjoint from the reported seeds 0..S-1) and scores each run on the VALIDATION
split (task.validation_size problems held out of training, disjoint from the test problems
the table reports) by the arm's own training objective: the held-out value of the objective
the run trains for at the k it ends with (the loop's eval/objective: the mean reward for
MEAN, max@k for MAX_AT_K, i.e. pass@k on binary rewards, maj@k for MAJORITY_AT_K, the
weighted max@k sum for a mixture such as MaxRL). The rate with the highest mean over the tuning
seeds is the arm's; a diverged run scores -inf. Nothing about the test problems or the
reported seeds enters the choice, so the reported comparison is not tuned on its own data.

The harness runs the grid (experiments.lab.table_cli.tune) and reports it; this module holds the
protocol's rules, free of the run machinery.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from kjax.rl.config import EvalSplit, TrainConfig


@dataclasses.dataclass(frozen=True)
class Tuning:
    """grid: learning rates tried for every arm; seeds: the tuning seeds (never reported)."""

    grid: tuple[float, ...]
    seeds: tuple[int, ...] = (1000, 1001)

    def __post_init__(self):
        if not self.grid or any(not (isinstance(lr, float) and lr > 0) for lr in self.grid):
            raise ValueError(f"Tuning.grid must be learning rates > 0; got {self.grid!r}.")
        if not self.seeds or min(self.seeds) < 100:
            raise ValueError(
                f"Tuning.seeds must be non-empty and >= 100 (reported seeds are 0..S-1, and "
                f"must never be tuned on); got {self.seeds!r}."
            )


OBJECTIVE = "objective"  # the run's eval/objective: kjax.rl.objective.objective_value


def runs_folder(learning_rate: float) -> str:
    """The folder of WORKDIR the tuning runs at one rate go in: tuning/lrX."""
    return f"tuning/lr{learning_rate:g}"


def for_tuning(cfg: TrainConfig, learning_rate: float) -> TrainConfig:
    """cfg at `learning_rate`, evaluated on its validation split."""
    if cfg.task.validation_size == 0:
        raise ValueError(
            "tuning scores runs on the validation split, but the table's base config holds "
            "none out (task.validation_size = 0); set task.validation_size in the table's base."
        )
    return with_learning_rate(
        dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, split=EvalSplit.VALIDATION)),
        learning_rate,
    )


def with_learning_rate(cfg: TrainConfig, learning_rate: float) -> TrainConfig:
    return dataclasses.replace(
        cfg, optimizer=dataclasses.replace(cfg.optimizer, learning_rate=learning_rate)
    )


def score(rows: Sequence[dict], metric: str) -> float:
    """Mean of metric over a grid point's tuning runs; -inf when one diverged or lacks it."""
    if not rows or any(r["status"] != "ok" or metric not in r["metrics"] for r in rows):
        return -math.inf
    return sum(r["metrics"][metric] for r in rows) / len(rows)


def choose(grid: Sequence[float], scores: Sequence[float]) -> float:
    """The rate of the best score; ties go to the smaller rate (the gentler update)."""
    if all(s == -math.inf for s in scores):
        raise ValueError(
            f"every learning rate of the grid {tuple(grid)} diverged or failed; widen the grid "
            "towards smaller rates."
        )
    best = max(scores)
    return min(lr for lr, s in zip(grid, scores, strict=True) if s == best)


def at_edge(chosen: dict[str, dict]) -> dict[str, str]:
    """{arm: "largest" | "smallest"} for the arms whose chosen rate is an end of a grid of
    three or more rates: the best rate may lie beyond the grid, which a wider grid would
    show. chosen: as tuning_table's."""
    edges = {}
    for arm, c in chosen.items():
        grid = sorted(c["grid"])
        if len(grid) >= 3 and c["lr"] in (grid[0], grid[-1]):
            edges[arm] = "largest" if c["lr"] == grid[-1] else "smallest"
    return edges


def edge_note(chosen: dict[str, dict]) -> str:
    """One line naming the arms tuned at an end of their grid (at_edge), or saying none."""
    edges = at_edge(chosen)
    if not edges:
        return "Chosen at an end of the grid: none."
    named = ", ".join(f"{arm} ({end})" for arm, end in edges.items())
    return (
        f"Chosen at an end of the grid, so the best rate may lie beyond it (a wider grid "
        f"would tell): {named}."
    )


def tuning_table(chosen: dict[str, dict]) -> str:
    """Markdown: per arm, the metric it was tuned on, each rate's mean validation score and
    the chosen rate. chosen: {arm: {"metric", "grid": [lr], "scores": [mean], "lr"}}."""
    grid = sorted({lr for c in chosen.values() for lr in c["grid"]})
    lines = [
        "| arm | tuned on (validation) | "
        + " | ".join(f"lr {lr:g}" for lr in grid)
        + " | chosen |",
        "|---|---|" + "---|" * len(grid) + "---|",
    ]
    for arm, c in chosen.items():
        by_lr = dict(zip(c["grid"], c["scores"], strict=True))
        cells = []
        for lr in grid:
            s = by_lr.get(lr)
            cells.append("" if s is None else "diverged" if s == -math.inf else f"{s:.3f}")
        lines.append(f"| {arm} | {c['metric']} | " + " | ".join(cells) + f" | {c['lr']:g} |")
    return "\n".join(lines)
