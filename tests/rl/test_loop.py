"""The host loop's pieces: dynamic-sampling batch filling, eval metrics, the NaN stop, a
restart before the first checkpoint."""

import dataclasses

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from kjax import checkpoint, evaluation
from kjax.objectives import reference, reference_majority
from kjax.rewards.verdict import Verdicts
from kjax.rl import loop
from kjax.rl.config import StepConfig
from kjax.rl.loop import fill_batch, train_and_evaluate
from tests.rl.tiny_run import TINY


def _candidates(adv_rows):
    return [
        {"advantages": np.asarray(a, np.float32), "id": np.arange(len(a)) + 10 * j}
        for j, a in enumerate(adv_rows)
    ]


def test_fill_batch_drops_uninformative_groups_and_refills_in_order():
    cands = _candidates([[[0, 0], [1, -1], [0, 0]], [[0, 0], [2, 0], [0, 1]]])
    batch, kept = fill_batch(cands, 3, dynamic=True)
    assert batch["id"].tolist() == [1, 11, 12] and kept == 3
    batch, kept = fill_batch(cands[:1], 3, dynamic=True)  # refills ran out: pad with zeros
    assert batch["id"].tolist() == [1, 0, 2] and kept == 1
    batch, kept = fill_batch(cands[:1], 3, dynamic=False)
    assert batch["id"].tolist() == [0, 1, 2] and kept == 3


def test_token_stats_count_real_tokens_and_both_paddings():
    # 2 prompts x 2 samples x T=5: completions of 1, 3, 0 and 2 tokens (6 real).
    lengths = np.array([[1, 3], [0, 2]])
    mask = np.arange(5)[None, None, :] < lengths[..., None]
    stats = loop.token_stats(mask, seconds=2.0)
    assert stats["tokens/real"] == 6
    assert stats["tokens/padding"] == pytest.approx(1 - 6 / 20)  # of B N T = 20 positions
    assert stats["tokens/sampler_padding"] == pytest.approx(1 - 6 / 12)  # 4 rows x longest 3
    assert stats["tokens/real_per_s"] == pytest.approx(3.0)
    empty = loop.token_stats(np.zeros((1, 2, 4), bool), seconds=1.0)
    assert empty["tokens/real"] == 0 and empty["tokens/sampler_padding"] == 0.0


def test_group_metrics_match_the_enumeration_oracles():
    rng = np.random.default_rng(0)
    answers = rng.integers(-1, 3, size=(5, 8)).astype(np.int32)
    scores = (answers == 0).astype(np.float32)
    target = np.zeros(5, np.int32)
    got = evaluation.group_metrics(Verdicts(scores, answers, target))
    assert evaluation.k_values(8) == [1, 2, 4, 8] and evaluation.k_values(6) == [1, 2, 4, 6]
    for k in (1, 2, 4, 8):
        np.testing.assert_allclose(
            got[f"pass@{k}"], reference.pass_at_k_ref(scores > 0, k).mean(), rtol=1e-5
        )
        np.testing.assert_allclose(
            got[f"max@{k}"], reference.max_at_k_ref(scores, k).mean(), rtol=1e-5
        )
        maj = reference_majority.majority_at_k_ref(answers, target, k).mean()
        np.testing.assert_allclose(got[f"maj@{k}"], maj, rtol=1e-5, atol=1e-6)


def _nan_at(step_fn, bad_step: int):
    """step_fn whose batch has NaN advantages when called at state.step == bad_step."""

    def step(state, batch, ref_params, k):
        if int(state.step) == bad_step:
            batch = batch._replace(advantages=batch.advantages * np.nan)
        return step_fn(state, batch, ref_params, k)

    return step


def test_nan_stop_keeps_the_last_good_checkpoint_and_a_rerun_resumes(tmp_path, monkeypatch):
    # The fault is injected by wrapping the built step function; no hook in the loop's API.
    build = loop.build_components

    def faulty(*args, **kwargs):
        components, state = build(*args, **kwargs)
        return dataclasses.replace(components, step_fn=_nan_at(components.step_fn, 4)), state

    monkeypatch.setattr(loop, "build_components", faulty)
    cfg = dataclasses.replace(TINY, steps=6, rl=StepConfig())  # B=8 over the 8 test devices
    with pytest.raises(FloatingPointError, match="not finite at RL step 4.*step 3"):
        train_and_evaluate(cfg, tmp_path, progress=False)
    with checkpoint.Checkpointer(tmp_path / "checkpoints", cfg.checkpoint) as ckpt:
        assert ckpt.latest_step() == 3
        manager_restore = ocp.args.Composite(state=ocp.args.StandardRestore())
        state = ckpt._manager.restore(3, args=manager_restore).state
        assert int(state["step"]) == 3  # the good state, all finite
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(state["params"]))
    steps = [r["step"] for r in evaluation.read_jsonl(tmp_path / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4]  # step 5 (index 4) was never logged
    # Rerun without the fault: from checkpoint 3, rows 0-3 kept and row 4 redone, once.
    monkeypatch.setattr(loop, "build_components", build)
    train_and_evaluate(cfg, tmp_path, progress=False)
    steps = [r["step"] for r in evaluation.read_jsonl(tmp_path / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4, 5, 6]


class _Killed(Exception):
    """Stands in for SIGKILL: the run dies at its first train step, before any checkpoint."""


def test_a_run_killed_before_its_first_checkpoint_writes_one_step_0_row(tmp_path, monkeypatch):
    build = loop.build_components

    def killed(*args, **kwargs):
        components, state = build(*args, **kwargs)

        def step_fn(*_):
            raise _Killed

        return dataclasses.replace(components, step_fn=step_fn), state

    monkeypatch.setattr(loop, "build_components", killed)
    cfg = dataclasses.replace(TINY, steps=6, rl=StepConfig())
    for _ in range(2):  # the run, then its restart: each evaluates step 0 and dies
        with pytest.raises(_Killed):
            train_and_evaluate(cfg, tmp_path, progress=False)
    assert [r["step"] for r in evaluation.read_jsonl(tmp_path / "metrics.jsonl")] == [0]
