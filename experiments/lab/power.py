"""Power of a table's claims from a pilot: the paired sd of each claim and what it buys.

  python -m experiments.lab.power [--tables=tang2025_table,...] [--results=DIR] [--target=0.03]

For every claim of each table, from the per-seed rows of a finished run of it (by default
the committed `experiments/results/NAME.jsonl`): the seeds, the mean paired difference, its
sd over seeds, the minimum detectable effect (80% power, one-sided 2.5%) at those seeds and
at 10 / 20 / 30 seeds, and the seeds needed for an MDE of `--target` and of half the
observed effect. The budget of a rerun is chosen from this table (docs/results.md, "Power"); a
pilot whose design differs from the rerun's (e.g. per-seed warm starts vs one shared warm
start) predicts the rerun's sd only as far as the design's variance sources agree.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

from experiments.lab import claims, harness
from kjax.files import write_atomic

TABLES = (
    "tang2025_table",
    "pkpo_kopt_table",
    "maxk_offpolicy_table",
    "dco_sft_table",
    "estimators_2026_table",
)


def claim_power(rows: list[dict], claim: claims.Claim, target: float) -> dict:
    """The pilot's figures for one claim (see the module docstring); nan without 2 seeds."""
    d = claims.differences(rows, claim)
    n = len(d)
    sd = float(np.std(d, ddof=1)) if n > 1 else math.nan
    mean = float(np.mean(d)) if n else math.nan
    out = {"claim": claim.id, "metric": claim.metric, "seeds": n, "mean": mean, "sd": sd}
    out["mde"] = claims.mde(sd, n)
    for m in (10, 20, 30):
        out[f"mde_at_{m}"] = claims.mde(sd, m)
    finite = math.isfinite(sd) and sd > 0
    out["seeds_for_target"] = claims.seeds_for_mde(sd, target) if finite else None
    half = abs(mean) / 2
    out["seeds_for_half_effect"] = claims.seeds_for_mde(sd, half) if finite and half > 0 else None
    return out


def power_table(rows: list[dict], table_claims, target: float) -> tuple[str, list[dict]]:
    got = [claim_power(rows, c, target) for c in table_claims]

    def f(x):
        return "n/a" if x is None or not math.isfinite(x) else f"{x:.3f}"

    lines = [
        f"| claim | metric | seeds | mean diff | sd | MDE | MDE at 10 / 20 / 30 | "
        f"seeds for MDE {target:g} | seeds for MDE = half the effect |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in got:
        at = " / ".join(f(p[f"mde_at_{m}"]) for m in (10, 20, 30))
        lines.append(
            f"| {p['claim']} | {p['metric']} | {p['seeds']} | {f(p['mean'])} | {f(p['sd'])} | "
            f"{f(p['mde'])} | {at} | {p['seeds_for_target'] or 'n/a'} | "
            f"{p['seeds_for_half_effect'] or 'n/a'} |"
        )
    return "\n".join(lines), got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiments.lab.power")
    p.add_argument("--tables", default=",".join(TABLES), help="comma-separated table modules")
    p.add_argument("--results", default="experiments/results", help="folder of NAME.jsonl")
    p.add_argument("--target", type=float, default=0.03, help="the MDE a budget must reach")
    p.add_argument("--out", default="", help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if not args.target > 0:
        p.error(f"--target must be > 0; got {args.target}")
    figures = {}
    for name in filter(None, args.tables.split(",")):
        path = pathlib.Path(args.results) / f"{name}.jsonl"
        if not path.exists():
            print(f"error: no pilot rows for {name}: {path} is missing", file=sys.stderr)
            return 1
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        table = harness.load_table(name)
        text, figures[name] = power_table(rows, table.claims, args.target)
        print(f"## {table.title}\n\npilot: {path}\n\n{text}\n")
    if args.out:
        write_atomic(args.out, json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
