"""experiments.tables.bon_frontier_table: the interpolation it reads mean-RL's frontier with, the
Pareto front of claim 10b, its committed rows' matched-KL differences and front shares
recomputed from the same rows' (KL, reward) points, and a --smoke run that writes every
arm and judges every claim."""

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


def test_pareto_front_keeps_exactly_the_undominated_points():
    points = {
        "a": (0.1, 0.30),  # lowest KL: on the front
        "b": (0.2, 0.30),  # same reward at more KL: dominated by a
        "c": (0.3, 0.40),  # on the front
        "d": (0.3, 0.35),  # same KL, less reward: dominated by c
        "e": (0.5, 0.38),  # more KL, less reward than c: dominated
        "f": (0.9, 0.45),  # highest reward: on the front
        "g": (0.9, 0.45),  # a tie with f: neither dominates the other, both on it
    }
    assert frontier.pareto_front(points) == {"a", "c", "f", "g"}
    assert frontier.pareto_front({"x": (1.0, 0.0)}) == {"x"}


def _committed():
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    seeds = sorted({r["seed"] for r in rows})
    return rows, seeds


def test_committed_differences_follow_from_the_committed_points():
    rows, seeds = _committed()
    assert len(seeds) == 10
    for seed in seeds:
        by_arm = {r["arm"]: r["metrics"] for r in rows if r["seed"] == seed}
        means = [by_arm[frontier.mean_name(c)] for c in frontier.MEAN_KL
                 if frontier.mean_name(c) in by_arm]  # fmt: skip
        kls, rewards = zip(*sorted((m["kl_seq"], m["max@1"]) for m in means), strict=True)
        for name in [f(n) for f in frontier.FAMILIES.values() for n in frontier.BON_N]:
            if name not in by_arm:
                continue
            m = by_arm[name]
            inside = kls[0] <= m["kl_seq"] <= kls[-1]
            assert m["in_range"] == float(inside)
            if inside:
                at = float(np.interp(m["kl_seq"], kls, rewards))
                assert m["mean_rl_at_kl"] == pytest.approx(at, abs=1e-12)
                assert m["reward_vs_mean_rl"] == pytest.approx(m["max@1"] - at, abs=1e-12)


def test_committed_front_shares_follow_from_the_committed_points():
    """Claim 10b's statistic recomputed by brute force from each seed's (KL, reward)
    points: a point is off the front iff another has KL <= and reward >=, one strict."""
    rows, seeds = _committed()
    for seed in seeds:
        by_arm = {r["arm"]: r["metrics"] for r in rows if r["seed"] == seed}
        for family, name_of in frontier.FAMILIES.items():
            means = [frontier.mean_name(c) for c in frontier.MEAN_KL]
            bons = [name_of(n) for n in frontier.BON_N]
            if not all(a in by_arm for a in means + bons):
                assert "front_share" not in by_arm.get(name_of(frontier.BON_N[0]), {})
                continue
            pts = {a: (by_arm[a]["kl_seq"], by_arm[a]["max@1"]) for a in means + bons}
            off = {a for a, (k, r) in pts.items() for b, (k2, r2) in pts.items()
                   if b != a and k2 <= k and r2 >= r and (k2, r2) != (k, r)}  # fmt: skip
            share = sum(a not in off for a in bons) / len(bons)
            mean_share = sum(a not in off for a in means) / len(means)
            m = by_arm[name_of(frontier.BON_N[0])]
            assert m["front_share"] == pytest.approx(share)
            assert m["front_gap"] == pytest.approx(share - mean_share)
            for a in means + bons:
                assert by_arm[a][f"on_front_{family}"] == float(a not in off)


def test_the_new_config_fields_leave_the_committed_fingerprints_alone():
    """objective.bon_anchor and bon_anchor_samples at their defaults are dropped from a
    table's fingerprint (harness._LATER_DEFAULTS), so the moving-anchor and mean-RL rows
    keep theirs; set, they change it."""
    import dataclasses

    from experiments.lab import harness
    from kjax.rl.config import BonAnchor

    cfg = frontier.bon(8)(frontier.TABLE.base(0, True))
    fields = dataclasses.asdict(cfg)
    harness._drop_later_defaults(fields)
    assert {"bon_anchor", "bon_anchor_samples"}.isdisjoint(fields["objective"])
    obj = dataclasses.replace(cfg.objective, bon_anchor=BonAnchor.REFERENCE,
                              bon_anchor_samples=4)  # fmt: skip
    fixed = dataclasses.replace(cfg, objective=obj)
    assert harness.fingerprint(fixed) != harness.fingerprint(cfg)


@pytest.mark.slow  # ~27 s on 2 cores: the default tier's 15-minute budget
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
