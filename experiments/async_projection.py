"""What asynchrony buys, projected: the synchronous RL step against the lagged ones.

  python -m experiments.async_projection \\
      [--plan=experiments/results/plan_scale/llama31_8b_passk_v5p-64.json] \\
      [--host_seconds=0] [--metrics=RUN/metrics.jsonl ...]

--plan: plan_scale summaries (compiled, not run): the sampler's and the update's projected
seconds on the slice. --metrics: measured runs (kjax.rl.loop's rows: time/sample,
time/verify + time/advantages as the host's share, time/update, time/step), whose mean
per-step seconds are projected the same way and, for a lagged run, set beside its measured
step. Every projection is kjax.scale.overlap_projection's (its docstring states the
assumptions): sync = sampler + host + update; one group at lag >= 1 = sampler + max(host,
update); a separate sampling group = the best split of the chips.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

from kjax.evaluation import read_jsonl
from kjax.scale import overlap_projection

DEFAULT_PLAN = "experiments/results/plan_scale/llama31_8b_passk_v5p-64.json"


def plan_rows(path: pathlib.Path, host_s: float) -> list[dict]:
    out = []
    for s in json.loads(path.read_text()):
        if not s.get("fits"):
            continue
        p = overlap_projection(s["sampler_seconds"], s["update_seconds"], host_s)
        what = f"{s['model']} {s['config'].split(':')[-1]} {s['topology']}"
        out.append(
            {
                "what": f"{what} ({s.get('label', 'compiled, not run')}; projection)",
                "sampler": s["sampler_seconds"],
                "host": host_s,
                "update": s["update_seconds"],
                **p,
                "measured": None,
            }  # fmt: skip
        )
    return out


def metrics_row(path: pathlib.Path) -> dict:
    rows = [r for r in read_jsonl(path) if "time/update" in r]
    if not rows:
        raise ValueError(f"--metrics: {path} has no RL step rows (time/update); give a run's "
                         "metrics.jsonl")  # fmt: skip
    rows = rows[1:] or rows  # the first step compiles
    mean = lambda key: float(np.mean([r.get(key, 0.0) for r in rows]))  # noqa: E731
    sampler, update = mean("time/sample"), mean("time/update")
    host = mean("time/verify") + mean("time/advantages")
    p = overlap_projection(sampler, update, host)
    return {"what": f"{path} (measured per-step means, projected)", "sampler": sampler,
            "host": host, "update": update, **p, "measured": mean("time/step")}  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = [
        "| run | sampler s | host s | update s | sync s | lag>=1, one group s | "
        "lag>=1, sampling group s (its share) | measured step s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        measured = "" if r["measured"] is None else f"{r['measured']:.2f}"
        lines.append(
            f"| {r['what']} | {r['sampler']:.2f} | {r['host']:.2f} | {r['update']:.2f} | "
            f"{r['sync']:.2f} | {r['one_group']:.2f} | {r['split']:.2f} "
            f"({r['split_fraction']:.0%}) | {measured} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiments.async_projection", description=__doc__)
    p.add_argument("--plan", nargs="*", default=[DEFAULT_PLAN])
    p.add_argument("--host_seconds", type=float, default=0.0,
                   help="host seconds per step assumed for --plan rows")  # fmt: skip
    p.add_argument("--metrics", nargs="*", default=[])
    args = p.parse_args(argv)
    if args.host_seconds < 0:
        print("--host_seconds must be >= 0 (seconds of host work per step)", file=sys.stderr)
        return 2
    try:
        rows = [r for f in args.plan for r in plan_rows(pathlib.Path(f), args.host_seconds)]
        rows += [metrics_row(pathlib.Path(f)) for f in args.metrics]
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"experiments.async_projection: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
