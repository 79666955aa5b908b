"""experiments.tables.bon_distill_table: its --smoke run writes the table with every arm, every
claim judged and a KL to the warm start per trained arm; the KL measurement is 0 against
itself and positive against another policy; the derived metrics follow their definitions."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import jax
import pytest

from experiments.lab import claims, harness, report, table_cli
from experiments.tables import bon_distill_table as bon


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bon_distill_table")
    assert table_cli.main(bon.TABLE, ["--workdir", str(workdir), "--smoke"]) == 0
    return workdir


def test_smoke_writes_every_arm_claim_and_kl(smoke):
    name = bon.TABLE.name
    for suffix in ("md", "jsonl", "claims.json", "tuning.jsonl"):
        assert (smoke / f"{name}.{suffix}").stat().st_size > 0
    assert (smoke / f"{name}.png").stat().st_size > 0
    rows = [json.loads(line) for line in (smoke / f"{name}.jsonl").read_text().splitlines()]
    assert {r["arm"]: r["status"] for r in rows} == {
        a.name: "ok" if a.name in bon.TABLE.smoke_arms else report.SMOKE_SKIPPED
        for a in bon.TABLE.arms
    }
    for r in rows:
        if r["status"] != "ok":
            continue
        m = r["metrics"]
        for key in ("kl_seq", "kl_token", "max@1", f"start/max@{bon.K}", "pass@16"):
            assert math.isfinite(m[key]), (r["arm"], key)
        assert m["kl_seq"] >= 0 and m["kl_token"] >= 0
        assert m["reward_gain"] == pytest.approx(m["max@1"] - m["start/max@1"])
        assert m["kl_at_bon_reward"] >= 0 or r["arm"] == bon.MEAN  # mean-RL may never get there
    mean = next(r["metrics"] for r in rows if r["arm"] == bon.MEAN)
    assert mean["curve_steps"] == list(range(1, bon.base(0, True).steps + 1))  # every checkpoint
    assert all(mean[f"curve/step{s}/kl_seq"] >= 0 for s in mean["curve_steps"])
    assert mean["reaches_bon_reward"] in (0.0, 1.0)
    text = (smoke / f"{name}.md").read_text()
    judged = json.loads((smoke / f"{name}.claims.json").read_text())["claims"]
    assert [j["claim"] for j in judged] == [c.id for c in bon.TABLE.claims]
    for claim in bon.TABLE.claims:
        verdicts = claims.possible_verdicts(claim)
        line = rf"^\| {claim.id} \|.*\| ({'|'.join(map(re.escape, verdicts))}) \|$"
        assert re.search(line, text, flags=re.M), claim.id


def test_kl_is_zero_to_itself_and_positive_to_another_policy(smoke):
    from kjax.rl import api

    arm = next(a for a in bon.TABLE.arms if a.name == bon.BON)
    chosen = json.loads((smoke / f"{bon.TABLE.name}.claims.json").read_text())["tuning"]["chosen"]
    ctx = table_cli.with_tuned_rates(harness.Context(smoke, smoke / "sft", smoke=True), chosen)
    cfg = harness.arm_config(bon.TABLE, arm, 0, ctx)
    cfg = dataclasses.replace(cfg, name=harness.slug(arm.name))
    run_dir = smoke / "runs" / harness.slug(arm.name) / "seed0" / "run"
    with api.open_run(cfg, run_dir) as run:
        key, problems = jax.random.key(0), run.task.test
        same = bon.kl_to_reference(run, run.params, run.params, problems, key, 2)
        assert (same["kl_seq"], same["kl_token"]) == (0.0, 0.0)
        assert 0.0 <= same["reward"] <= 1.0
        other = jax.tree.map(lambda x: 1.5 * x, run.params)  # sharper logits: another policy
        kl = bon.kl_to_reference(run, other, run.params, problems, key, 2)
        assert kl["kl_seq"] > 0 and kl["kl_token"] > 0
        assert kl["kl_seq"] >= kl["kl_token"]  # every completion has >= 1 token


def test_kl_at_reward_is_the_first_crossing_of_the_curve():
    points = [(0.3, 0.0), (0.4, 0.16), (0.5, 0.64), (0.45, 0.81), (0.7, 1.69)]
    assert bon.kl_at_reward(points, 0.35) == pytest.approx(0.2**2)  # sqrt(KL) halfway
    assert bon.kl_at_reward(points, 0.5) == pytest.approx(0.64)
    assert bon.kl_at_reward(points, 0.6) == pytest.approx((0.9 + 0.4 * 0.15 / 0.25) ** 2)  # a dip
    assert bon.kl_at_reward(points, 0.2) == 0.0  # the warm start already has it
    assert bon.kl_at_reward(points, 0.8) is None  # never reached


def test_derived_metrics_follow_their_definitions():
    m = {"max@1": 0.6, "start/max@1": 0.4, f"start/max@{bon.K}": 0.8, "kl_seq": 0.25}
    d = bon.derive(m)
    assert d["reward_gain"] == pytest.approx(0.2)
    assert d["bon_gap"] == pytest.approx(-0.2)
    assert d["gap_closed"] == pytest.approx(0.5)
    assert d["gain_per_sqrt_kl"] == pytest.approx(0.4)
    flat = bon.derive({**m, f"start/max@{bon.K}": 0.4, "kl_seq": 0.0})  # no gap, no KL
    assert "gap_closed" not in flat and "gain_per_sqrt_kl" not in flat
    assert bon.derive({"max@1": 0.5}) == {}
