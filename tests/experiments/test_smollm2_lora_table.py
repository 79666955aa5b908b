"""The table-7 rework (experiments/tables/smollm2_lora_passk.py) declares what it will run:
every arm's config (full and smoke budgets) validates, trains LoRA on SmolLM2, and each
claim compares two of its arms on a metric the table reports; its pilot sizes the table
from the pilot's own rows; the GPU script's CPU smoke path writes rows --from_rows judges.
Its real runs are not in CI."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from experiments.lab.table_runs import read_result
from experiments.tables import smollm2_lora_passk as t
from kjax.rl.config import ModelKind, Objective

ROOT = pathlib.Path(__file__).parent.parent.parent


def test_arms_and_claims_are_declared_before_any_run():
    names = {arm.name for arm in t.TABLE.arms}
    for smoke in (False, True):
        for arm in t.TABLE.arms:
            cfg = arm.make(t.TABLE.base(0, smoke)).validate(1)
            assert cfg.model.lora.rank > 0  # the smoke run exercises the LoRA path too
            if not smoke:
                assert cfg.model.kind is ModelKind.PRETRAINED and cfg.model.lora.rank == 16
                assert cfg.eval.n_eval >= 2 * t.K  # unbiased pass@8 with room to spare
                assert cfg.task.validation_size > 0 and cfg.task.test_size >= cfg.eval.problems
                if cfg.objective.objective is Objective.MAX_AT_K:
                    assert cfg.objective.k == t.K
    metrics = {m for _, m in t.TABLE.columns}
    for claim in t.TABLE.claims:
        assert {claim.arm, claim.baseline} <= names and claim.metric in metrics
    # the pilot runs the table's design at one untuned rate, and tunes nothing
    for arm in t.PILOT.arms:
        cfg = arm.make(t.PILOT.base(0, False))
        assert cfg.optimizer.learning_rate == t.PILOT_LR and t.PILOT.tuning is None
        table_cfg = arm.make(t.TABLE.base(0, False))
        assert cfg.steps == table_cfg.steps and cfg.eval == table_cfg.eval


def _mde(sd, n):  # the one-sided 2.5% paired t-test's MDE at 80% power, from its definition
    return (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / np.sqrt(n)


@pytest.mark.parametrize("spelling", ["--workdir={}", "--workdir {}"])
def test_pilot_sizes_the_table_from_its_rows(tmp_path, monkeypatch, spelling):
    """--pilot runs PILOT into WORKDIR/pilot at PILOT_SEEDS seeds, then writes the seeds an
    MDE of 0.03 needs from the sd of the rows' paired differences."""
    rng = np.random.default_rng(0)
    pass8 = {arm: rng.uniform(0.2, 0.6, t.PILOT_SEEDS) for arm in (t.MEAN, t.PASSK)}
    pass1 = {arm: rng.uniform(0.05, 0.2, t.PILOT_SEEDS) for arm in (t.MEAN, t.PASSK)}
    seen = {}

    def fake_main(table, argv, default_seeds):
        seen.update(table=table, argv=argv)
        workdir = pathlib.Path(argv[0].split("=", 1)[1])
        workdir.mkdir(parents=True)
        rows = [{"arm": arm, "seed": s, "status": "ok",
                 "metrics": {"pass@8": pass8[arm][s], "pass@1": pass1[arm][s]}}
                for arm in pass8 for s in range(t.PILOT_SEEDS)]  # fmt: skip
        text = "\n".join(json.dumps(r) for r in rows)
        (workdir / f"{table.name}.jsonl").write_text(text)
        return 0

    monkeypatch.setattr(t.table_cli, "main", fake_main)
    argv = ["--pilot", *spelling.format(tmp_path).split(" ")]
    assert t.main(argv) == 0
    assert seen["table"] is t.PILOT
    assert seen["argv"] == [f"--workdir={tmp_path / 'pilot'}", f"--seeds={t.PILOT_SEEDS}"]
    figures = json.loads((tmp_path / "pilot" / f"{t.PILOT.name}.power.json").read_text())
    for got, metric in zip(figures, ("pass@8", "pass@1"), strict=True):
        grid = pass8 if metric == "pass@8" else pass1
        d = grid[t.PASSK] - grid[t.MEAN]
        sd = np.std(d, ddof=1)
        assert got["metric"] == metric and got["seeds"] == t.PILOT_SEEDS
        assert got["sd"] == pytest.approx(sd) and got["mde"] == pytest.approx(_mde(sd, 3))
        n = got["seeds_for_target"]
        assert _mde(sd, n) <= t.TARGET_MDE < _mde(sd, n - 1)
    assert "seeds for MDE 0.03" in (tmp_path / "pilot" / f"{t.PILOT.name}.power.md").read_text()


@pytest.mark.slow
def test_gpu_script_smoke_path_writes_rows_from_rows_judges(tmp_path):
    """experiments/bench/gpu_table7.sh --smoke on CPU: its three phases (train, report, judge
    from rows) end in a judged table of the same rows. Minutes: the slow tier."""
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
           "JAX_PLATFORMS": "cpu"}  # fmt: skip
    done = subprocess.run(["bash", "experiments/bench/gpu_table7.sh", str(tmp_path), "--smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "train.json").read_text())["train_exit_code"] == 0
    rows = (tmp_path / "table7" / f"{t.TABLE.name}.jsonl").read_text().splitlines()
    judged = (tmp_path / "judged" / f"{t.TABLE.name}.jsonl").read_text().splitlines()
    assert len(rows) == len(t.TABLE.arms) and len(judged) == len(rows)
    assert [json.loads(r)["status"] for r in rows] == ["ok"] * len(rows)
    text = (tmp_path / "judged" / f"{t.TABLE.name}.md").read_text()
    assert all(f"| {c.id} |" in text for c in t.TABLE.claims)


def _rows(d8, d1, seeds):
    """Rows whose pass@8 / pass@1 paired differences (pass@k arm minus mean arm) are d8 / d1."""
    rows = []
    for s in seeds:
        rows.append({"arm": t.MEAN, "seed": s, "status": "ok",
                     "metrics": {"pass@8": 0.4, "pass@1": 0.3}})  # fmt: skip
        rows.append({"arm": t.PASSK, "seed": s, "status": "ok",
                     "metrics": {"pass@8": 0.4 + d8[s], "pass@1": 0.3 + d1[s]}})  # fmt: skip
    return rows


def _fewest(sd):  # the fewest seeds whose MDE is <= 0.03, by walking n up
    n = 2
    while _mde(sd, n) > t.TARGET_MDE:
        n += 1
    return n


@pytest.mark.parametrize("scale, expect", [(0.044, None), (0.002, "floor"), (0.2, "cap")])
def test_seeds_rule_reads_the_first_seeds_sd_only(tmp_path, capsys, scale, expect):
    """The second stage (the comment at SEEDS): S from the sd of seeds 0..SEEDS-1 only, the
    larger claim's, kept within [SEEDS, MAX_SEEDS]; later seeds' rows do not move it."""
    z = np.random.default_rng(1).normal(size=t.SEEDS)
    z = (z - z.mean()) / z.std(ddof=1)  # sd exactly 1 over the first SEEDS seeds
    d8 = list(0.01 + scale * z) + [5.0, -5.0]  # 2 later seeds, wild
    d1 = list(-0.05 + scale / 2 * z[::-1]) + [5.0, -5.0]
    rows = _rows(d8, d1, range(t.SEEDS + 2))
    wanted = max(_fewest(np.std(d[: t.SEEDS], ddof=1)) for d in (d8, d1))
    got = t.seeds_needed(rows)
    assert got["wanted"] == wanted
    assert got["seeds"] == min(max(wanted, t.SEEDS), t.MAX_SEEDS)
    if expect == "floor":
        assert got["seeds"] == t.SEEDS
    elif expect == "cap":
        assert got["seeds"] == t.MAX_SEEDS < wanted
    else:
        assert t.SEEDS < got["seeds"] < t.MAX_SEEDS
    (tmp_path / f"{t.TABLE.name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert t.main([f"--workdir={tmp_path}", "--seeds_rule"]) == 0
    assert f"run to --seeds={got['seeds']}" in capsys.readouterr().out


def test_seeds_rule_refuses_unfinished_seeds(tmp_path, capsys):
    d = [0.01] * t.SEEDS
    rows = _rows(d, d, range(t.SEEDS - 1))  # the last seed not finished
    with pytest.raises(ValueError, match="finish step 2"):
        t.seeds_needed(rows)
    assert t.main([f"--workdir={tmp_path}", "--seeds_rule"]) == 1  # no rows file
    assert "missing" in capsys.readouterr().err


def test_step_two_runs_to_what_the_rule_gives_on_the_committed_first_seeds():
    """STAGE2_SEEDS (step 2's default --seeds, and what the claims say they are judged at)
    is the rule applied to the committed rows of seeds 0..SEEDS-1 (experiments.lab.carry
    saved every finished run's result.json), not a number typed in."""
    carried = ROOT / "experiments" / "results" / "smollm2_lora_passk" / "carried" / "runs"
    rows = [read_result(p) for p in sorted(carried.glob("*/seed*/result.json"))]
    rows = [r for r in rows if r["table"] == t.TABLE.name and r["status"] == "ok"]
    assert {(r["arm"], r["seed"]) for r in rows if r["seed"] < t.SEEDS} == {
        (arm.name, s) for arm in t.TABLE.arms for s in range(t.SEEDS)
    }
    assert t.seeds_needed(rows)["seeds"] == t.STAGE2_SEEDS
    assert f"{t.STAGE2_SEEDS} seeds" in t.TABLE.claims[0].text
