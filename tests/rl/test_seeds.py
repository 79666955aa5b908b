"""kjax.rl.seeds: seeds in lockstep train what separate runs train, stop alone on NaN,
resume from their own checkpoints, and refuse configs that cannot share a step."""

import dataclasses
import json

import numpy as np
import pytest

from kjax import checkpoint
from kjax.rl import seeds as seeds_lib
from kjax.rl.config import StepConfig
from kjax.rl.loop import train_and_evaluate
from kjax.rl.seeds import train_seeds
from tests.rl.tiny_run import TINY

CFG = dataclasses.replace(TINY, steps=6, rl=StepConfig())  # B=8 over the 8 test devices
SEEDS = (0, 1)


def _rows(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(lockstep_dir, separate_dir):
    """The same rows: equal rewards and evaluations (the same tokens were drawn), losses and
    gradient norms equal up to float32 rounding of the batched matmuls."""
    a, b = _rows(lockstep_dir), _rows(separate_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(CFG.steps + 1))
    for ra, rb in zip(a, b, strict=True):
        evals = sorted(k for k in rb if k.startswith("eval/"))
        assert sorted(k for k in ra if k.startswith("eval/")) == evals
        for key in evals + (["reward_mean"] if "loss" in rb else []):
            assert ra[key] == rb[key], (ra["step"], key)
        for key in ("loss", "grad_norm") if "loss" in rb else ():
            np.testing.assert_allclose(ra[key], rb[key], rtol=1e-4, atol=1e-6)
        if "loss" in rb:
            assert ra["lockstep_seeds"] >= 1 and "lockstep_seeds" not in rb


@pytest.mark.slow  # ~50 s on 2 busy cores; lockstep is opt-in (harness --lockstep)
def test_lockstep_matches_separate_runs_and_a_nan_seed_stops_alone(tmp_path, monkeypatch):
    cfgs = [dataclasses.replace(CFG, seed=s) for s in SEEDS]
    for cfg in cfgs:
        train_and_evaluate(cfg, tmp_path / f"separate{cfg.seed}", progress=False)

    # Seed 1's advantages turn NaN at RL step 4 (the fifth advantages call of the group).
    calls = []
    advantages = seeds_lib._Lockstep.advantages

    def faulty(self, k, scores, answer_ids, target):
        adv = advantages(self, k, scores, answer_ids, target)
        calls.append(None)
        return adv.at[1].multiply(np.nan) if len(calls) == 5 else adv

    monkeypatch.setattr(seeds_lib._Lockstep, "advantages", faulty)
    dirs = [tmp_path / f"lockstep{s}" for s in SEEDS]
    results = train_seeds(cfgs, dirs, progress=False)
    assert isinstance(results[1], FloatingPointError)
    assert "not finite at RL step 4" in str(results[1])
    assert results[0] == {k: v for k, v in _rows(dirs[0])[-1].items() if k.startswith("eval/")}
    _assert_same_run(dirs[0], tmp_path / "separate0")  # seed 0 went on, unaffected
    with checkpoint.Checkpointer(dirs[1] / "checkpoints", CFG.checkpoint) as ckpt:
        assert ckpt.latest_step() == 3
    assert [r["step"] for r in _rows(dirs[1])] == list(range(5))  # step 5's row never written

    # Rerun without the fault: seed 0 is done, seed 1 resumes alone from step 3.
    monkeypatch.setattr(seeds_lib._Lockstep, "advantages", advantages)
    again = train_seeds(cfgs, dirs, progress=False)
    assert again[0] == results[0]
    rows = _rows(dirs[1])
    assert [r["step"] for r in rows] == list(range(CFG.steps + 1))
    assert all(r["lockstep_seeds"] == 1 for r in rows if r["step"] > 3)
    _assert_same_run(dirs[1], tmp_path / "separate1")
    assert (dirs[1] / "pass_at_k_vs_step.png").exists()


def test_lockstep_refuses_configs_that_cannot_share_a_step(tmp_path):
    base = [dataclasses.replace(CFG, seed=s) for s in (0, 1)]
    dirs = [tmp_path / "a", tmp_path / "b"]
    other_lr = dataclasses.replace(
        base[1], optimizer=dataclasses.replace(CFG.optimizer, learning_rate=1e-4)
    )
    with pytest.raises(ValueError, match=r"seed 1.*\['optimizer'\].*only in seed"):
        train_seeds([base[0], other_lr], dirs)
    with pytest.raises(ValueError, match="seeds .* repeat"):
        train_seeds([base[0], base[0]], dirs)
    with pytest.raises(ValueError, match="share a workdir"):
        train_seeds(base, [dirs[0], dirs[0]])
    with pytest.raises(ValueError, match="one workdir per config"):
        train_seeds(base, dirs[:1])
    dynamic = [dataclasses.replace(c, dynamic_sampling=True) for c in base]
    with pytest.raises(ValueError, match="dynamic_sampling=true"):
        train_seeds(dynamic, dirs)
    pooled = [dataclasses.replace(c, verifier_workers=1) for c in base]
    with pytest.raises(ValueError, match="verifier_workers"):
        train_seeds(pooled, dirs)
    assert not dirs[0].exists() and not dirs[1].exists()  # refused before touching a workdir
    # names and warm-start folders may differ
    named = dataclasses.replace(base[1], name="other")
    assert seeds_lib.lockstep_identity(named) == seeds_lib.lockstep_identity(base[0])


@pytest.mark.slow  # ~50 s on 2 busy cores
def test_a_tables_lockstep_rows_are_its_sequential_rows(tmp_path):
    from experiments.lab import harness, table_cli
    from experiments.lab.claims import Claim
    from kjax.rl.config import Objective, ObjectiveConfig

    passk = lambda c: dataclasses.replace(c, objective=ObjectiveConfig(Objective.MAX_AT_K, k=4))  # noqa: E731
    table = harness.Table(
        "t",
        "t",
        (
            harness.Arm("mean", lambda c: dataclasses.replace(c, objective=ObjectiveConfig())),
            harness.Arm("passk", passk),
        ),  # fmt: skip
        (Claim("1", "passk beats mean", "pass@4", "passk", "mean"),),
        (("pass@1", "pass@1"), ("pass@4", "pass@4")),
        lambda seed, smoke: dataclasses.replace(CFG, steps=4),
        "4 steps",
        plot=lambda *a: None,
    )
    both = {}
    for mode, extra in (("lockstep", ["--lockstep", "2"]), ("sequential", [])):
        argv = ["--workdir", str(tmp_path / mode), "--seeds", "2", *extra]
        assert table_cli.main(table, argv) == 0
        both[mode] = [json.loads(x) for x in (tmp_path / mode / "t.jsonl").read_text().splitlines()]
    lock, seq = both["lockstep"], both["sequential"]
    assert [(r["arm"], r["seed"]) for r in lock] == [(r["arm"], r["seed"]) for r in seq]
    for a, b in zip(lock, seq, strict=True):
        assert a["lockstep_seeds"] == 2 and "lockstep_seeds" not in b
        assert a["status"] == b["status"] == "ok"
        assert a["metrics"].keys() == b["metrics"].keys()
        for key, value in b["metrics"].items():
            np.testing.assert_allclose(a["metrics"][key], value, rtol=1e-5, err_msg=key)
    assert (tmp_path / "lockstep" / "runs" / "passk" / "seed1" / "run" / "metrics.jsonl").exists()
    # the lockstep rows carry the fingerprint a rerun asks for: reused, nothing retrains
    result = tmp_path / "lockstep" / "runs" / "mean" / "seed0" / "result.json"
    before = result.stat().st_mtime_ns
    argv = ["--workdir", str(tmp_path / "lockstep"), "--seeds", "2", "--lockstep", "2"]
    assert table_cli.main(table, argv) == 0
    assert result.stat().st_mtime_ns == before


def test_runs_that_differ_only_in_seed_share_one_compiled_update(tmp_path):
    from kjax.rl.components import build_components

    def step_of(cfg, name):
        c, _ = build_components(cfg, tmp_path / name, log=lambda *a: None)
        c.close()
        return c.step_fn

    seed0 = step_of(CFG, "a")
    assert step_of(dataclasses.replace(CFG, seed=7), "b") is seed0
    other_lr = dataclasses.replace(
        CFG, optimizer=dataclasses.replace(CFG.optimizer, learning_rate=1e-4)
    )
    assert step_of(other_lr, "c") is not seed0
