"""Asynchronous RL in the loop: rl.policy_lag, rl.lag_correction and mesh.sampler_devices.

- Lag 0 is the synchronous loop: train_and_evaluate's final parameters are bitwise those of
  a reference loop written here from the public pieces (rollout, advantages, the jitted
  update), the algorithm as it was before lags existed.
- Lag d draws step t's rollouts from the parameters of step t - d: the same reference loop,
  keeping every parameter version and sampling step t from version max(t - d, 0), gives
  bitwise the parameters of kjax's queue of pending rollouts.
- A sampling group (4 of the 8 fake CPU devices) samples step t + 1 while the other 4 run
  step t's update: the rows' dispatch/ready times overlap, and the run equals the
  one-group run to float tolerance.
- Bad combinations are refused with the choice spelled out.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from kjax.data import loader
from kjax.rl import loop, multihost
from kjax.rl.config import (
    LagCorrection,
    MaxAtKEstimator,
    MeanBaseline,
    MeshConfig,
    Objective,
    ObjectiveConfig,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.rl.train_step import RLBatch
from tests.rl.tiny_run import TINY

STEPS = 5
CFG = dataclasses.replace(
    TINY,
    steps=STEPS,
    rl=StepConfig(microbatches=1),
    checkpoint=dataclasses.replace(TINY.checkpoint, every=STEPS),
    eval=dataclasses.replace(TINY.eval, every=STEPS),
)


def _with_lag(cfg, lag, correction=LagCorrection.EXACT, **mesh):
    rl = dataclasses.replace(cfg.rl, policy_lag=lag, lag_correction=correction)
    return dataclasses.replace(cfg, rl=rl, mesh=dataclasses.replace(cfg.mesh, **mesh))


def _final_params(workdir, step=STEPS):
    manager = ocp.CheckpointManager(workdir / "checkpoints")
    out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    state = out.state
    return state["train"]["params"] if "train" in state else state["params"]


def _reference(cfg, workdir, lag: int):
    """The loop from its pieces: version v = parameters after v updates; step t samples
    from version max(t - lag, 0) with key fold_in(fold_in(base, t), 0), computes the
    advantages at its k and updates version t."""
    c, state = loop.build_components(cfg, workdir, log=lambda *a, **k: None)
    try:
        batches = loop.Batches(c.task.train, cfg.batch_prompts, cfg.seed, loader.Position())
        versions = [jax.tree.map(jnp.copy, state.params)]
        for t in range(cfg.steps):
            key = jax.random.fold_in(jax.random.fold_in(c.base_key, t), 0)
            params = versions[max(t - lag, 0)]
            ro = loop.rollout(c, params, next(batches), key, cfg.samples, cfg.temperature)
            v = ro.verdicts
            k = cfg.k_at(t)
            adv = c.advantages(cfg.objective, k, jnp.asarray(v.scores),
                               jnp.asarray(v.answer_ids), jnp.asarray(v.target))  # fmt: skip
            batch = RLBatch(
                ro.prompts, ro.prompt_mask, ro.tokens, ro.mask,
                np.asarray(ro.sampler_logprobs), v.scores, np.asarray(adv),
            )  # fmt: skip
            batch = RLBatch(*(multihost.put(np.asarray(a), c.batch_sharding) for a in batch))
            state, _ = c.step_fn(state, batch, c.ref_params, np.int32(k))
            versions.append(jax.tree.map(jnp.copy, state.params))
        return versions[-1]
    finally:
        c.close()


def _assert_bitwise(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("lag", [0, 2])
def test_loop_equals_the_reference_loop_bitwise(tmp_path, lag):
    cfg = _with_lag(CFG, lag) if lag else CFG
    loop.train_and_evaluate(cfg, tmp_path / "loop", progress=False, log=lambda *a, **k: None)
    want = _reference(cfg, tmp_path / "reference", lag)
    _assert_bitwise(_final_params(tmp_path / "loop"), want)


def _rows(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


def test_sampling_group_overlaps_the_update_and_matches_one_group(tmp_path):
    """4 + 4 devices at lag 1: the sampler of step t + 1 is dispatched before step t's
    update is awaited and both are in flight at once; the parameters equal the one-group
    lag-1 run's (8 devices, data-parallel) to float tolerance."""
    assert jax.device_count() == 8
    steps = 4
    base = dataclasses.replace(
        CFG, steps=steps, checkpoint=dataclasses.replace(CFG.checkpoint, every=steps),
        eval=dataclasses.replace(CFG.eval, every=steps),
    )  # fmt: skip
    split = _with_lag(base, 1, sampler_devices=4)
    one = _with_lag(base, 1)
    loop.train_and_evaluate(split, tmp_path / "split", progress=False, log=lambda *a, **k: None)
    loop.train_and_evaluate(one, tmp_path / "one", progress=False, log=lambda *a, **k: None)
    rows = _rows(tmp_path / "split")
    overlapped = [r for r in rows if "time/overlap" in r]
    assert len(overlapped) == steps - 1  # every step but the last samples ahead
    for r in overlapped:
        # dispatched before the other finished, both ways: in flight at once
        assert r["time/update_dispatched"] < r["time/sample_ready"]
        assert r["time/sample_dispatched"] < r["time/update_ready"]
        assert r["time/overlap"] > 0
    assert not any("time/overlap" in r for r in _rows(tmp_path / "one"))
    a, b = _final_params(tmp_path / "split", steps), _final_params(tmp_path / "one", steps)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
    losses = [r["loss"] for r in rows], [r["loss"] for r in _rows(tmp_path / "one")]
    np.testing.assert_allclose(*losses, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------ bad input


def _validate(**changes):
    return dataclasses.replace(CFG, **changes).validate(8)


def test_exact_correction_is_refused_where_it_is_not_exact():
    lagged = StepConfig(policy_lag=1, lag_correction=LagCorrection.EXACT)
    for objective, names in [
        (ObjectiveConfig(Objective.MEAN, mean_baseline=MeanBaseline.GROUP_ZSCORE), "GROUP_ZSCORE"),
        (ObjectiveConfig(Objective.MAJORITY_AT_K, k=2), "MAJORITY_AT_K"),
        (ObjectiveConfig(Objective.MAX_AT_K, k=2, max_at_k_estimator=MaxAtKEstimator.LOO), "LOO"),
    ]:
        with pytest.raises(ValueError) as e:
            _validate(rl=lagged, objective=objective)
        text = str(e.value)
        assert names in text and "rl.lag_correction=TIS" in text and "biased" in text
        assert "rl.policy_lag=0" in text
    for objective in (
        ObjectiveConfig(Objective.MEAN),
        ObjectiveConfig(Objective.MAX_AT_K, k=2, max_at_k_estimator=MaxAtKEstimator.L2O),
    ):
        _validate(rl=lagged, objective=objective)  # exact there: accepted


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(lag_correction=LagCorrection.TIS), "rl.tis_cap"),
        (dict(policy_lag=2, tis_cap=2.0), "rl.lag_correction=TIS"),
        (dict(lag_correction=LagCorrection.EXACT, tis_cap=2.0), "Unset rl.tis_cap"),
        (
            dict(lag_correction=LagCorrection.EXACT, loss=PolicyLoss.PPO, epochs=2),
            "rl.ratio_level=SEQUENCE",
        ),
        (dict(policy_lag=-1), "rl.policy_lag"),
    ],
)
def test_ambiguous_lag_settings_are_refused(changes, says):
    with pytest.raises(ValueError, match=says.replace(".", r"\.")):
        StepConfig(**changes)


def test_ppo_exact_with_sequence_ratio_is_accepted():
    cfg = StepConfig(
        loss=PolicyLoss.PPO,
        epochs=2,
        ratio_level=RatioLevel.SEQUENCE,
        policy_lag=2,
        lag_correction=LagCorrection.EXACT,
    )
    # every update re-weights, against the behaviour policy the batch carries
    assert cfg.reweights and not cfg.needs_old_logprobs


def test_uncorrected_lag_is_named_in_the_log(tmp_path):
    lines = []
    cfg = dataclasses.replace(_with_lag(CFG, 1, LagCorrection.NONE), steps=1)
    cfg = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, total_steps=1))
    loop.train_and_evaluate(cfg, tmp_path / "r", progress=False, log=lines.append)
    assert any("rl.policy_lag=1" in x and "biased" in x for x in lines)


def test_sampling_group_must_leave_training_devices():
    with pytest.raises(ValueError, match="mesh.sampler_devices"):
        _validate(mesh=MeshConfig(sampler_devices=8))
