"""experiments.lab.power: a pilot's paired sd and the seeds a target MDE needs."""

import json
import math
import pathlib

import numpy as np
from scipy import stats

from experiments.lab import power
from experiments.lab.claims import Claim
from experiments.tables import tang2025_table

RESULTS = pathlib.Path(__file__).resolve().parents[3] / "experiments" / "results"


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


def test_cli_refuses_a_missing_pilot(tmp_path, capsys):
    rows = _rows([0.02, 0.05, -0.01, 0.04])
    (tmp_path / "tang2025_table.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert power.main(["--tables=pkpo_kopt_table", f"--results={tmp_path}"]) == 1
    assert "pkpo_kopt_table.jsonl is missing" in capsys.readouterr().err


def test_cli_power_of_the_committed_table_1(tmp_path):
    """On table 1's committed rows (real arms, 10 seeds): every claim gets its 10 seeds and
    the MDE its committed claims.json reports, and 1a's figures are the t-quantile formula
    on paired differences taken by hand from the rows (no kjax code)."""
    out = tmp_path / "power.json"
    assert power.main(["--tables=tang2025_table", f"--results={RESULTS}", f"--out={out}"]) == 0
    figures = {f["claim"]: f for f in json.loads(out.read_text())["tang2025_table"]}
    assert list(figures) == [c.id for c in tang2025_table.TABLE.claims]  # the table's order
    judged = json.loads((RESULTS / "tang2025_table.claims.json").read_text())["claims"]
    for j in judged:
        assert figures[j["claim"]]["seeds"] == j["seeds"] == 10, j["claim"]
        assert math.isclose(figures[j["claim"]]["mde"], j["mde"], rel_tol=1e-9), j["claim"]
    claim = next(c for c in tang2025_table.TABLE.claims if c.id == "1a")
    by = {}
    for line in (RESULTS / "tang2025_table.jsonl").read_text().splitlines():
        row = json.loads(line)
        by[row["arm"], row["seed"]] = row["metrics"][claim.metric]
    d = np.array([by[claim.arm, s] - by[claim.baseline, s] for s in range(10)])
    sd = float(np.std(d, ddof=1))
    a1a = figures["1a"]
    assert math.isclose(a1a["mean"], float(d.mean()), rel_tol=1e-12)
    assert math.isclose(a1a["sd"], sd, rel_tol=1e-12)
    for n, key in ((10, "mde"), (20, "mde_at_20"), (30, "mde_at_30")):
        want = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
        assert math.isclose(a1a[key], want, rel_tol=1e-9), key
    assert 0 < a1a["mde"] < abs(a1a["mean"])  # a real power figure, not a placeholder
