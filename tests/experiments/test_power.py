"""experiments.power: a pilot's paired sd and the seeds a target MDE needs."""

import json
import math

import numpy as np
from scipy import stats

from experiments import power, tang2025_table
from experiments.claims import Claim


def _rows(diffs):
    rows = []
    for seed, d in enumerate(diffs):
        rows.append({"arm": "a", "seed": seed, "status": "ok", "metrics": {"m": 0.5}})
        rows.append({"arm": "b", "seed": seed, "status": "ok", "metrics": {"m": 0.5 + d}})
    return rows


def test_claim_power_against_the_t_quantiles():
    d = [0.02, 0.05, -0.01, 0.04, 0.03]
    got = power.claim_power(_rows(d), Claim("1", "", "m", "b", "a"), target=0.03)
    sd = np.std(d, ddof=1)
    assert got["seeds"] == 5 and math.isclose(got["sd"], sd, rel_tol=1e-9)
    for n, key in ((5, "mde"), (20, "mde_at_20")):
        want = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
        assert math.isclose(got[key], want, rel_tol=1e-9)
    n = got["seeds_for_target"]
    assert got["mde_at_10"] > 0.03 or n <= 10
    mde_n = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    mde_before = (stats.t.ppf(0.975, n - 2) + stats.t.ppf(0.8, n - 2)) * sd / math.sqrt(n - 1)
    assert mde_n <= 0.03 < mde_before  # the fewest seeds that reach the target


def test_cli_writes_figures_and_refuses_a_missing_pilot(tmp_path, capsys):
    rows = _rows([0.02, 0.05, -0.01, 0.04])
    (tmp_path / "tang2025_table.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert power.main(["--tables=pkpo_kopt_table", f"--results={tmp_path}"]) == 1
    assert "pkpo_kopt_table.jsonl is missing" in capsys.readouterr().err
    out = tmp_path / "power.json"
    assert power.main(["--tables=tang2025_table", f"--results={tmp_path}", f"--out={out}"]) == 0
    figures = json.loads(out.read_text())["tang2025_table"]
    assert [f["claim"] for f in figures] == [c.id for c in tang2025_table.TABLE.claims]
    assert [f["claim"] for f in figures][:2] == ["1a", "1b"]  # the table's own order
    assert all(f["seeds"] == 0 for f in figures)  # its arms are not in these rows
