"""experiments.tables.bon_frontier_table: the interpolation it reads mean-RL's frontier with, its
committed rows' matched-KL differences recomputed from the same rows' (KL, reward) points,
and a --smoke run that writes every arm and judges every claim."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from experiments.lab import report, table_cli
from experiments.tables import bon_frontier_table as frontier

ROOT = pathlib.Path(__file__).parents[3]
ROWS = ROOT / "experiments" / "results" / "bon_frontier_table.jsonl"


def test_interpolate_is_the_piecewise_linear_curve_inside_its_range_only():
    points = [(1.0, 0.5), (0.0, 0.1), (0.5, 0.4)]  # unsorted on purpose
    assert frontier.interpolate(points, 0.25) == pytest.approx(0.25)  # 0.1 + 0.5 * 0.3
    assert frontier.interpolate(points, 0.75) == pytest.approx(0.45)
    assert frontier.interpolate(points, 1.0) == pytest.approx(0.5)
    assert frontier.interpolate(points, -0.01) is None
    assert frontier.interpolate(points, 1.01) is None


def test_committed_differences_follow_from_the_committed_points():
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    seeds = sorted({r["seed"] for r in rows})
    assert len(seeds) == 10
    for seed in seeds:
        by_arm = {r["arm"]: r["metrics"] for r in rows if r["seed"] == seed}
        means = [by_arm[frontier.mean_name(c)] for c in frontier.MEAN_KL]
        kls, rewards = zip(*sorted((m["kl_seq"], m["max@1"]) for m in means), strict=True)
        for n in frontier.BON_N:
            m = by_arm[frontier.bon_name(n)]
            inside = kls[0] <= m["kl_seq"] <= kls[-1]
            assert m["in_range"] == float(inside)
            if inside:
                at = float(np.interp(m["kl_seq"], kls, rewards))
                assert m["mean_rl_at_kl"] == pytest.approx(at, abs=1e-12)
                assert m["reward_vs_mean_rl"] == pytest.approx(m["max@1"] - at, abs=1e-12)


def test_smoke_run_writes_every_arm_and_judges_every_claim(tmp_path):
    assert table_cli.main(frontier.TABLE, ["--workdir", str(tmp_path), "--smoke"]) == 0
    name = frontier.TABLE.name
    rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert {r["arm"]: r["status"] for r in rows} == {
        a.name: "ok" if a.name in frontier.TABLE.smoke_arms else report.SMOKE_SKIPPED
        for a in frontier.TABLE.arms
    }
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    judged = json.loads((tmp_path / f"{name}.claims.json").read_text())["claims"]
    assert [j["claim"] for j in judged] == [c.id for c in frontier.TABLE.claims]
