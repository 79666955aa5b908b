"""The trainer's routes to TTRL's label-free reward, max@k shrinkage and MaxRL's practical
form (ObjectiveConfig.reward / min_agreement, max_at_k_shrinkage, Objective.MAXRL_PRACTICAL):
each equals the library function it names, the shrunk mixture is unbiased by enumeration,
bad combinations are refused, old workdirs keep their identity, and a TTRL run logs how
often its labels were wrong."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from kjax import checkpoint, evaluation
from kjax import objectives as obj
from kjax.rewards.verdict import Verdicts
from kjax.rl import loop
from kjax.rl.config import (
    MaxAtKEstimator,
    MeanBaseline,
    Objective,
    ObjectiveConfig,
    RewardSource,
    StepConfig,
    TrainConfig,
    to_json,
)
from kjax.rl.loop import train_and_evaluate
from kjax.rl.objective import compute_advantages, objective_value
from tests.objectives.test_shrinkage import PROMPTS, bernoulli_moments, grad_pass_at_k
from tests.rl.tiny_run import TINY

E = MaxAtKEstimator
VOTE = RewardSource.MAJORITY_VOTE
RNG = np.random.default_rng(0)
ANSWERS = RNG.integers(-1, 3, size=(6, 8)).astype(np.int32)
TARGET = np.zeros(6, np.int32)
SCORES = (ANSWERS == 0).astype(np.float32)  # the verifier's labels, not what TTRL trains on


@pytest.mark.parametrize(
    ("cfg", "k", "want"),
    [
        (ObjectiveConfig(Objective.MEAN, reward=VOTE), 1,
         lambda r: obj.mean_advantages(r, MeanBaseline.RLOO) / 8),
        (ObjectiveConfig(Objective.MAX_AT_K, k=4, reward=VOTE, min_agreement=0.4), 4,
         lambda r: obj.max_at_k_advantages(r, 4, E.LOO_MINUS_ONE)),
    ],
)  # fmt: skip
def test_majority_vote_trains_on_the_groups_own_labels(cfg, k, want):
    pseudo = obj.majority_pseudo_rewards(ANSWERS, cfg.min_agreement)
    got = compute_advantages(cfg, k, jnp.asarray(SCORES), ANSWERS, TARGET)
    np.testing.assert_allclose(got, want(pseudo), rtol=1e-6, atol=1e-7)
    assert not np.allclose(got, compute_advantages(dataclasses.replace(
        cfg, reward=RewardSource.VERIFIER, min_agreement=0.0), k, jnp.asarray(SCORES)))  # fmt: skip
    with pytest.raises(ValueError, match="answer_ids"):
        compute_advantages(cfg, k, jnp.asarray(SCORES))
    # The held-out value still scores the verifier's labels.
    assert objective_value(cfg, k, SCORES, ANSWERS, TARGET) == pytest.approx(
        float(jnp.mean(obj.max_at_k(jnp.asarray(SCORES), k)))
    )


def test_shrinkage_and_maxrl_practical_route_to_the_library():
    r = jnp.asarray(RNG.uniform(size=(5, 6)).astype(np.float32))
    cfg = ObjectiveConfig(Objective.MAX_AT_K, k=3, max_at_k_shrinkage=True,
                          max_at_k_estimator=E.L2O)  # fmt: skip
    np.testing.assert_allclose(
        compute_advantages(cfg, 3, r), obj.shrink_max_at_k_advantages(r, 3, E.L2O), rtol=1e-6
    )
    mix = ObjectiveConfig(Objective.MAX_AT_K_MIXTURE, maxrl_t=4, max_at_k_shrinkage=True)
    want = sum(w * obj.shrink_max_at_k_advantages(r, k, E.LOO_MINUS_ONE)
               for k, w in obj.maxrl_weights(4).items())  # fmt: skip
    np.testing.assert_allclose(compute_advantages(mix, None, r), want, rtol=1e-5, atol=1e-7)
    practical = ObjectiveConfig(Objective.MAXRL_PRACTICAL)
    np.testing.assert_allclose(
        compute_advantages(practical, None, r), obj.maxrl_practical_advantages(r) / 6, rtol=1e-6
    )
    assert objective_value(practical, None, r) == pytest.approx(float(jnp.mean(r)))


@pytest.mark.parametrize("estimator", [E.L2O, E.LOO_MINUS_ONE])
def test_shrunk_mixture_is_unbiased_for_the_mixture(estimator):
    """Every outcome of 3 Bernoulli prompts x N = 4 draws: E[sum_i A_bi grad log p(y_bi)] =
    sum_k w_k grad pass@k, MaxRL's weights w_k = 1/k for k <= 3."""
    weights = obj.maxrl_weights(3)
    cfg = ObjectiveConfig(Objective.MAX_AT_K_MIXTURE, maxrl_t=3, max_at_k_shrinkage=True,
                          max_at_k_estimator=estimator)  # fmt: skip
    for ps in PROMPTS[:2]:
        got, _ = bernoulli_moments(ps, 4, lambda r: compute_advantages(cfg, None, r))
        want = sum(w * grad_pass_at_k(ps, k) for k, w in weights.items())
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(objective=Objective.MEAN, max_at_k_shrinkage=True), "mean_baseline=shrinkage"),
        (
            dict(
                objective=Objective.MAX_AT_K, k=2, max_at_k_shrinkage=True, max_at_k_estimator=E.S
            ),
            "max_at_k_shrinkage",
        ),  # fmt: skip
        (dict(objective=Objective.MAJORITY_AT_K, k=2, reward="majority_vote"), "MAJORITY_AT_K"),
        (dict(min_agreement=0.5), "reward=majority_vote"),
        (dict(reward="majority_vote", min_agreement=1.5), "min_agreement"),
        (dict(reward="labels"), "reward"),
        (dict(objective=Objective.MAXRL_PRACTICAL, k=2), "k"),
        (dict(objective=Objective.MAX_AT_K, k=2, max_at_k_shrinkage=1), "bool"),
    ],
)
def test_bad_combinations_name_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        ObjectiveConfig(**fields)


def test_dynamic_sampling_refuses_max_at_k_shrinkage():
    cfg = dataclasses.replace(
        TINY,
        dynamic_sampling=True,
        objective=ObjectiveConfig(Objective.MAX_AT_K, k=2, max_at_k_shrinkage=True),
    )
    with pytest.raises(ValueError, match="dynamic_sampling"):
        cfg.validate(8)


def test_new_fields_at_their_defaults_keep_an_old_workdirs_identity(tmp_path):
    """A workdir written before the fields existed (its experiment.json lacks them) resumes
    under the default config; setting one changes the identity and is refused there."""
    old = to_json(TINY)
    assert set(old["objective"]) == {"objective", "k", "mean_baseline", "max_at_k_estimator",
                                     "majority_centered", "mixture_weights", "maxrl_t"}  # fmt: skip
    checkpoint.ensure_workdir(tmp_path, old)
    checkpoint.ensure_workdir(tmp_path, to_json(TINY))
    ttrl = dataclasses.replace(TINY, objective=ObjectiveConfig(Objective.MAX_AT_K, k=2,
                                                                reward=VOTE))  # fmt: skip
    assert to_json(ttrl)["objective"]["reward"] == "majority_vote"
    with pytest.raises(ValueError, match="objective"):
        checkpoint.ensure_workdir(tmp_path, to_json(ttrl))


def test_a_ttrl_run_logs_its_label_error_and_evaluates_on_true_labels(tmp_path, monkeypatch):
    """A verifier under which the vote and the truth disagree everywhere: every sample gives
    the same wrong answer (class 1; the reference is class 0) and scores 0. The vote labels
    every group with that answer, so pseudo-rewards are all 1 (label_wrong = reward_error =
    1), while the true pass@1 and maj@k are 0: an evaluation that scored pseudo-labels
    would report 1."""

    def unanimous_and_wrong(c, examples, tokens, mask):
        b, n = tokens.shape[:2]
        return Verdicts(np.zeros((b, n), np.float32), np.ones((b, n), np.int32),
                        np.zeros(b, np.int32))  # fmt: skip

    monkeypatch.setattr(loop, "verify", unanimous_and_wrong)
    cfg: TrainConfig = dataclasses.replace(
        TINY,
        steps=2,
        rl=StepConfig(),
        objective=ObjectiveConfig(Objective.MEAN, reward=VOTE, min_agreement=0.5),
    )
    last = train_and_evaluate(cfg, tmp_path, progress=False)
    rows = evaluation.read_jsonl(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    for row in steps:  # the training rewards were the vote's
        assert row["pseudo/labelled"] == 1.0 and row["pseudo/label_wrong"] == 1.0
        assert row["pseudo/reward_error"] == 1.0
    for k in (1, cfg.eval.n_eval):  # the evaluation's were the verifier's
        assert last[f"eval/pass@{k}"] == 0.0 and last[f"eval/maj@{k}"] == 0.0
    assert "pseudo/labelled" not in rows[0]
