"""What rl.lag_correction=EXACT refuses, and its weight's guard against overflow.

- A log-ratio log(pi/mu) far beyond float32's exp range (88.7) with every advantage 0 gives
  a finite loss and exactly zero gradients (the weight is formed in log space), for PG and
  decoupled PPO; a nonzero advantage there is clamped at e^60 and counted.
- EXACT is refused with what would truncate or reshape the weighted score: rl.tis_cap,
  rl.offpolicy_clamp, rl.offpolicy_max_at_k=LINEAR and GRPO's per-length aggregation.
- The run's log says the KL penalty and entropy bonus are not importance-weighted.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.rl import components, losses
from kjax.rl.config import (
    LagCorrection,
    LossAggregation,
    Objective,
    ObjectiveConfig,
    OffPolicyMaxAtK,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.rl.train_step import RLBatch, loss_of_logprobs
from tests.rl.tiny_run import TINY

B, N, T = 1, 3, 2
PG = StepConfig(policy_lag=2, lag_correction=LagCorrection.EXACT)
PPO = StepConfig(
    policy_lag=2,
    lag_correction=LagCorrection.EXACT,
    loss=PolicyLoss.PPO,
    ratio_level=RatioLevel.SEQUENCE,
)


def _batch(advantages, sampler_logprobs):
    prompts = jnp.zeros((B, 1), jnp.int32)
    tokens = jnp.zeros((B, N, T), jnp.int32)
    mask = jnp.ones((B, N, T), bool)
    scores = jnp.zeros((B, N))
    return RLBatch(prompts, prompts == 0, tokens, mask, sampler_logprobs, scores, advantages)


def _grad(cfg, logp, batch):
    def loss(lp):
        return loss_of_logprobs(lp, batch, cfg, old_logprobs=jax.lax.stop_gradient(lp))

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(logp)
    return value, metrics, grad


@pytest.mark.parametrize("cfg", [PG, PPO], ids=["PG", "PPO"])
def test_a_huge_ratio_with_zero_advantages_gives_zero_gradients(cfg):
    logp = jnp.full((B, N, T), -0.1)
    mu = jnp.full((B, N, T), -60.0)  # log(pi/mu) = 2 * 59.9 = 119.8 per sample > 88.7
    assert float(jnp.exp(jnp.sum(logp - mu, -1)).max()) == math.inf  # the naive weight
    value, metrics, grad = _grad(cfg, logp, _batch(jnp.zeros((B, N)), mu))
    assert np.isfinite(float(value)) and float(value) == 0.0
    np.testing.assert_array_equal(np.asarray(grad), 0.0)
    assert float(metrics["lag_log_ratio_max"]) > 88.7


def test_a_huge_weighted_advantage_is_clamped_and_counted():
    logp = jnp.full((B, N, T), -0.1)
    mu = jnp.full((B, N, T), -60.0)
    adv = jnp.array([[1.0, 0.0, -1.0]])
    _, metrics, grad = _grad(PG, logp, _batch(adv, mu))
    grad = np.asarray(grad)
    assert np.all(np.isfinite(grad))
    bound = math.exp(losses.MAX_LOG_WEIGHTED_ADVANTAGE)
    np.testing.assert_allclose(grad[0, :, 0], [-bound, 0.0, bound], rtol=1e-5)
    np.testing.assert_allclose(float(metrics["lag_weight_capped_fraction"]), 2 / 3)


def test_the_weighted_advantage_is_w_times_a_below_the_clamp():
    rng = np.random.default_rng(0)
    log_w = rng.normal(scale=3.0, size=(4, 5))
    adv = rng.normal(size=(4, 5))
    adv[0, :2] = 0.0
    got, capped = losses.importance_weighted_advantages(jnp.asarray(log_w), jnp.asarray(adv))
    np.testing.assert_allclose(np.asarray(got), np.exp(log_w) * adv, rtol=1e-5)
    assert not bool(jnp.any(capped))


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(tis_cap=2.0), "Unset rl.tis_cap"),
        (
            dict(
                loss=PolicyLoss.PPO,
                epochs=2,
                ratio_level=RatioLevel.SEQUENCE,
                offpolicy_max_at_k=OffPolicyMaxAtK.EXACT,
                offpolicy_clamp=5.0,
            ),
            "Unset rl.offpolicy_clamp",
        ),
        (
            dict(
                loss=PolicyLoss.PPO,
                epochs=2,
                ratio_level=RatioLevel.SEQUENCE,
                offpolicy_max_at_k=OffPolicyMaxAtK.LINEAR,
            ),
            "rl.offpolicy_max_at_k=LINEAR",
        ),
        (dict(aggregation=LossAggregation.SEQ_MEAN_TOKEN_MEAN), "rl.aggregation=TOKEN_SUM"),
        (dict(loss=PolicyLoss.PPO, epochs=2), "rl.ratio_level=SEQUENCE"),
    ],
)
def test_exact_is_refused_with_what_would_bias_it(changes, says):
    with pytest.raises(ValueError, match=says.replace(".", r"\.")) as e:
        StepConfig(policy_lag=2, lag_correction=LagCorrection.EXACT, **changes)
    assert "EXACT" in str(e.value)


def test_exact_accepts_the_unbiased_aggregations():
    for aggregation in (LossAggregation.TOKEN_SUM, LossAggregation.CONSTANT_NORMALIZER):
        rl = StepConfig(policy_lag=2, lag_correction=LagCorrection.EXACT, aggregation=aggregation)
        assert rl.aggregation is aggregation and rl.lag_correction is LagCorrection.EXACT


@pytest.mark.parametrize("correction", [LagCorrection.EXACT, LagCorrection.TIS])
def test_the_log_says_kl_and_entropy_are_not_importance_weighted(correction):
    extra = dict(tis_cap=2.0) if correction is LagCorrection.TIS else {}
    rl = StepConfig(
        policy_lag=1, lag_correction=correction, kl_coef=0.1, entropy_coef=0.01, **extra
    )
    lines = []
    cfg = dataclasses.replace(TINY, rl=rl, objective=ObjectiveConfig(Objective.MEAN))
    components._warn_lag(cfg, lines.append)
    (line,) = lines
    assert "KL penalty and entropy bonus are NOT importance-weighted" in line
    lines.clear()
    quiet = dataclasses.replace(rl, kl_coef=0.0, entropy_coef=0.0)
    components._warn_lag(dataclasses.replace(cfg, rl=quiet), lines.append)
    assert "importance-weighted" not in lines[0]
