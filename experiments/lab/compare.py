"""Two runs of one table, row by row: do the numbers and the verdicts survive a rerun?

  python -m experiments.lab.compare --table=tang2025_table A/NAME.jsonl B/NAME.jsonl

For every (arm, seed) present in both, the largest absolute difference over the metrics
they share, and how many rows are bit-identical; then each claim judged on both sets of
rows (only the arms and seeds both runs hold), its verdict in each and whether it changed.
experiments/lab/fresh_venv_check.sh uses it to rerun a table's headline arms from a fresh clone in a
fresh venv installed from constraints.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from experiments.lab import claims, harness


def read(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(table, a: list[dict], b: list[dict]) -> dict:
    """{"rows": [{arm, seed, max_abs_diff, identical}], "claims": [{claim, a, b, changed}]}
    over the (arm, seed) pairs both row sets finished."""
    key = lambda r: (r["arm"], r["seed"])  # noqa: E731
    ok_a = {key(r): r for r in a if r["status"] == "ok"}
    ok_b = {key(r): r for r in b if r["status"] == "ok"}
    common = sorted(set(ok_a) & set(ok_b))
    rows = []
    for k in common:
        ma, mb = ok_a[k]["metrics"], ok_b[k]["metrics"]
        shared = [m for m in ma if m in mb and isinstance(ma[m], float)]
        diffs = [abs(ma[m] - mb[m]) for m in shared if math.isfinite(ma[m] - mb[m])]
        rows.append(
            {
                "arm": k[0],
                "seed": k[1],
                "max_abs_diff": max(diffs, default=0.0),
                "identical": all(ma[m] == mb[m] for m in shared),
            }  # fmt: skip
        )
    arms = {arm for arm, _ in common}
    judged = [c for c in table.claims if c.arm in arms and c.baseline in (None, *arms)]
    sa = claims.judge_all([ok_a[k] for k in common], judged)
    sb = claims.judge_all([ok_b[k] for k in common], judged)
    verdicts = [
        {
            "claim": c.id,
            "a": x["verdict"],
            "b": y["verdict"],
            "changed": x["verdict"] != y["verdict"],
            "diff_a": x["mean"],
            "diff_b": y["mean"],
        }  # fmt: skip
        for c, x, y in zip(judged, sa, sb, strict=True)
    ]
    return {"rows": rows, "claims": verdicts, "machines": [machines(a), machines(b)]}


def machines(rows: list[dict]) -> list[str]:
    """The CPUs a set of rows ran on, each as "model [instruction sets]" (rows written
    before provenance recorded them say so)."""

    def name(p: dict) -> str:
        if not p:
            return "no provenance"
        features = p.get("cpu_features")
        return f"{p.get('cpu', '?')} [{' '.join(features) if features is not None else '?'}]"

    return sorted({name(r.get("provenance") or {}) for r in rows})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiments.lab.compare")
    p.add_argument("--table", required=True, help="the table module, e.g. tang2025_table")
    p.add_argument("a", type=pathlib.Path)
    p.add_argument("b", type=pathlib.Path)
    args = p.parse_args(argv)
    for path in (args.a, args.b):
        if not path.exists():
            print(f"error: {path}: no such file", file=sys.stderr)
            return 1
    table = harness.load_table(args.table)
    out = compare(table, read(args.a), read(args.b))
    same = sum(r["identical"] for r in out["rows"])
    worst = max((r["max_abs_diff"] for r in out["rows"]), default=0.0)
    print(f"{len(out['rows'])} runs in both; {same} bit-identical; largest difference {worst:.3g}")
    if out["machines"][0] != out["machines"][1]:
        print(
            f"  ran on {', '.join(out['machines'][0])} vs {', '.join(out['machines'][1])}: "
            "XLA's CPU code, and so its rounding, depends on the CPU's instruction sets, so "
            "rows need not be bit-identical there"
        )
    for v in out["claims"]:
        mark = "CHANGED" if v["changed"] else "same"
        print(
            f"  {v['claim']}: {v['a']} ({v['diff_a']:+.4f}) vs {v['b']} ({v['diff_b']:+.4f}) {mark}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
