"""A table's outputs: the Markdown report, the bar plot, and the files that hold them.

NAME.jsonl (a row per run), NAME.claims.json (every claim's p-values and verdict, the
tuning, the writer's provenance), NAME.md and NAME.png; experiments.lab.harness writes them
after a table's runs, and `--from_rows` from a finished table's rows.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from experiments.lab import tuning
from experiments.lab.claims import TEST, MetricKey, claims_table, fmt, judge_all, t_interval, values
from experiments.lab.provenance import provenance, provenance_line
from kjax.files import write_atomic, write_figure

if TYPE_CHECKING:  # the type only: harness imports this module
    from experiments.lab.harness import Table

SMOKE_BUDGET = ("SMOKE, not a result: 2 RL steps of 8 x 8 from a 4-step SFT, tiny eval; "
                "arms marked 'validated' were configured and validated, not trained")  # fmt: skip
SMOKE_SKIPPED = "validated"
RUNNING = "running in another worker"


def arm_table(rows: list[dict], arms: Sequence[str], columns) -> str:
    head = "| arm | " + " | ".join(label for label, _ in columns) + " | runs |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        cells = [fmt(*t_interval(list(values(rows, arm, key).values()))) for _, key in columns]
        kinds = ("ok", "diverged", SMOKE_SKIPPED, RUNNING)
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


def report(
    table: Table,
    rows: list[dict],
    seeds: Sequence[int],
    smoke: bool,
    written: dict | None = None,
    chosen: dict | None = None,
    tuning_hours: float = 0.0,
) -> str:
    """The Markdown of the table: budget, the test, arm table, claims with verdicts and
    their tests, the tuning (`chosen`, when the table tunes), run time (`tuning_hours` of
    it in tuning runs), and `written` (a provenance() of the writer) when given."""
    hours = sum(r.get("wall_s", 0.0) for r in rows) / 3600
    diverged = [
        f"{r['arm']} (seed {r['seed']}" + (f": {r['error']})" if r.get("error") else ")")
        for r in rows
        if r["status"] == "diverged"
    ]  # with the reason: a FloatingPointError from a bug reads as one, never as a result
    judged = judge_all(rows, table.claims)
    parts = [
        f"## {table.title}",
        "",
        f"Budget: {SMOKE_BUDGET if smoke else table.budget}. Seeds: "
        f"{', '.join(map(str, seeds))}. Cells: mean over seeds [95% t-interval].",
        "",
        arm_table(rows, [a.name for a in table.arms], table.columns),
        "",
        claims_table(table.claims, judged),
        "",
        TEST,
        "",
    ]
    if chosen:
        t = table.tuning
        parts += [
            f"Learning rates (tuning seeds {', '.join(map(str, t.seeds))}, disjoint from the "
            "reported ones; scored on the validation split, disjoint from the test problems, "
            "by each arm's own objective; mean over the tuning seeds):",
            "",
            tuning.tuning_table(chosen),
            "",
            tuning.edge_note(chosen),
            "",
        ]
    parts += [
        f"Diverged: {', '.join(diverged) or 'none'}. Compute: {hours:.2f} h of run time "
        "(sum over runs)"
        + (f", and {tuning_hours:.2f} h of tuning runs." if tuning_hours else "."),
    ]
    if written is not None:
        parts += ["", provenance_line(written)]
        commits = commits_note(rows)
        if commits:
            parts[-1] += " " + commits
        bare = sum("provenance" not in r for r in rows)
        if bare:
            parts[-1] += (
                f" {bare} of {len(rows)} rows carry no provenance: they were run before it was "
                "recorded (README says where they came from)."
            )
    return "\n".join(parts) + "\n"


def bar_plot(table: Table, rows: list[dict], path: pathlib.Path) -> None:
    """Grouped bars with 95% intervals: the @k metrics in one panel (a group per column,
    a bar per arm), every other column (e.g. gradient variance) in its own log panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a.name for a in table.arms]
    rates = [c for c in table.columns if MetricKey.find(c[1]) is not None]
    others = [c for c in table.columns if MetricKey.find(c[1]) is None]
    panels = [rates] + [[c] for c in others] if rates else [[c] for c in others]
    widths = [max(4, 1.1 * len(p) * len(arms) / 3) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4.2), squeeze=False,
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    width = 0.8 / len(arms)
    for ax, cols in zip(axes[0], panels, strict=True):
        for i, arm in enumerate(arms):
            cis = [t_interval(list(values(rows, arm, key).values())) for _, key in cols]
            mean = np.array([m for m, _, _ in cis])
            err = np.array([[m - lo, hi - m] for m, lo, hi in cis]).T
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
    write_figure(fig, path, dpi=110)
    plt.close(fig)


def write_outputs(
    table: Table,
    rows: list[dict],
    seeds,
    smoke: bool,
    out: pathlib.Path,
    chosen: dict | None = None,
    tuning_rows: Sequence[dict] = (),
) -> str:
    """NAME.jsonl (a row per run), NAME.claims.json (judge_all's p's and verdicts), NAME.md
    and NAME.png in out; the last three record this writer's provenance(). A tuned table
    also writes NAME.tuning.jsonl (a row per tuning run, with its "lr") and the chosen
    rates in NAME.claims.json."""
    out.mkdir(parents=True, exist_ok=True)
    written = provenance()
    write_atomic(out / f"{table.name}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    if chosen:
        lines = "".join(json.dumps(r) + "\n" for r in tuning_rows)
        write_atomic(out / f"{table.name}.tuning.jsonl", lines)
    judged = [
        {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in j.items()}
        for j in judge_all(rows, table.claims)
    ]
    claims = {"test": TEST, "seeds": list(seeds), "provenance": written, "claims": judged}
    if chosen:
        claims["tuning"] = {"seeds": list(table.tuning.seeds), "chosen": chosen}
    write_atomic(out / f"{table.name}.claims.json", json.dumps(claims, indent=1) + "\n")
    tuning_hours = sum(r.get("wall_s", 0.0) for r in tuning_rows) / 3600
    text = report(table, rows, seeds, smoke, written, chosen, tuning_hours)
    write_atomic(out / f"{table.name}.md", text)
    (table.plot or bar_plot)(table, rows, out / f"{table.name}.png")
    return text


def commits_note(rows: list[dict]) -> str:
    """Which commits trained the rows, with their counts, so that a table run over several
    sessions shows whether its rows share one code ("" when no row records a commit)."""
    counts: dict[str, int] = {}
    for r in rows:
        commit = r.get("provenance", {}).get("commit")
        if commit:
            counts[commit[:7]] = counts.get(commit[:7], 0) + 1
    if not counts:
        return ""
    named = ", ".join(f"{c} ({n} row{'s' * (n != 1)})" for c, n in counts.items())
    many = "" if len(counts) == 1 else f"; rows of {len(counts)} commits: not one code"
    return f"Rows trained at commit {named}{many}."
