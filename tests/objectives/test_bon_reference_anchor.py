"""vBoN's objective in the trainer (ObjectiveConfig.bon_anchor=REFERENCE), by exact enumeration.

vBoN (Amini et al. 2024) minimises KL(pi || pi_bon^ref), pi_bon^ref the best-of-n
distribution of the FIXED reference. kjax/objectives/bon_distill.py derives
E_pi[log(w_n / n)] - KL(pi || pi_ref) = -KL(pi || pi_bon^ref) - log n (ties split
exactly). Here the trainer's own pieces are put together on a 4-armed softmax bandit with
one-token completions (T = 1): compute_advantages routed with bon_anchor=REFERENCE against
anchor rewards whose empirical CDF is the reference's exact CDF (pi_ref's probabilities are
multiples of 1/M and the M anchors hold each arm that many times), plus
kjax.rl.losses' policy-gradient surrogate and K2 penalty at rl.kl_coef = 1. Every group of
N samples is enumerated, so the expected update is exact: it must equal the gradient of
-KL(pi || pi_bon^ref), pi_bon^ref from all n-tuples of reference draws, and vanish at
pi_bon^ref. Nothing is sampled.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.rl import losses
from kjax.rl.config import BonAnchor, KLEstimator, LossAggregation, StepConfig, TrainConfig
from kjax.rl.objective import Objective, ObjectiveConfig, compute_advantages
from kjax.rl.seeds import unsupported
from tests.objectives.helpers import all_outcomes

M = 8
COUNTS = np.array([2, 3, 1, 2])  # pi_ref = COUNTS / M, exactly representable by M anchors
VALUES = {
    "distinct": np.array([0.1, 0.7, 0.35, 0.9]),
    "ties": np.array([0.1, 0.7, 0.35, 0.7]),  # arms 1 and 3 tie
}
THETA = np.array([0.3, -0.2, 0.5, 0.1])  # a policy that is neither pi_ref nor pi_bon


def best_of_n(p, values, n):
    """P(the best of n draws from p is arm y), ties among the best split uniformly."""
    out = np.zeros_like(p)
    for draw in itertools.product(range(len(p)), repeat=n):
        best = max(values[a] for a in draw)
        winners = [a for a in draw if values[a] == best]
        for a in winners:
            out[a] += np.prod(p[list(draw)]) / len(winners)
    return out


def reference_cfg(n):
    return ObjectiveConfig(
        Objective.BON_DISTILL, k=n, bon_anchor=BonAnchor.REFERENCE, bon_anchor_samples=M
    )


def expected_update(theta, values, n, kl_coef=1.0, samples=3):
    """E over every group of `samples` draws from softmax(theta) of minus the gradient of
    the trainer's loss (PG surrogate + kl_coef * K2 to pi_ref, TOKEN_SUM), in float64."""
    outcomes = all_outcomes(len(values), samples)  # [G, N]
    anchors = np.repeat(values, COUNTS)[None, :]  # [1, M]: F_hat = F exactly
    args = (theta, values, anchors, COUNTS / M, kl_coef)
    return np.asarray(_expected_update(*map(jnp.asarray, args), jnp.asarray(outcomes), n))


@functools.partial(jax.jit, static_argnums=6)
def _expected_update(theta, values, anchors, p_ref, kl_coef, outcomes, n):
    scores = values[outcomes]  # [G, N]
    g, samples = outcomes.shape
    # the route, as the loop calls it: the group's scores and the prompt's anchor rewards
    adv = compute_advantages(reference_cfg(n), None, scores, None, None,
                             jnp.broadcast_to(anchors, (g, M)))  # fmt: skip
    mask = jnp.ones((1, samples, 1), bool)

    def loss(th, outcome, a):
        logp = jax.nn.log_softmax(th)[outcome][None, :, None]  # [1, N, 1]
        pg, _ = losses.policy_gradient_loss(logp, a[None], mask, LossAggregation.TOKEN_SUM)
        ref = jnp.log(p_ref)[outcome][None, :, None]
        kl, _ = losses.kl_penalty_loss(logp, ref, mask, KLEstimator.K2, LossAggregation.TOKEN_SUM)
        return pg + kl_coef * kl

    grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(theta, outcomes, adv)
    weights = jnp.prod(jax.nn.softmax(theta)[outcomes], axis=-1)  # [G]
    return -jnp.einsum("g,ga->a", weights, grads)


@pytest.mark.parametrize("kind", sorted(VALUES))
@pytest.mark.parametrize("n", [4])  # n = 4 > N = 3: best-of-n is a target, not a subset
def test_expected_update_is_the_gradient_of_minus_kl_to_the_references_best_of_n(kind, n):
    values, p_ref = VALUES[kind], COUNTS / M
    target = best_of_n(p_ref, values, n)
    pi = np.exp(THETA - THETA.max())
    pi /= pi.sum()
    log_ratio = np.log(pi) - np.log(target)
    # d/dtheta_a of -sum_i pi_i log(pi_i / q_i) for pi = softmax(theta), in closed form
    want = -pi * (log_ratio - pi @ log_ratio)
    with jax.enable_x64(True):
        got = expected_update(THETA, values, n)
    assert np.abs(want).max() > 1e-2  # THETA is far from the optimum: the check has teeth
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_stationary_point_is_the_references_best_of_n_only_at_kl_weight_one(kind):
    """At pi = pi_bon^ref (closed form: all n-tuples of reference draws) the expected update
    is 0 with rl.kl_coef = 1, and not at pi_ref. With weight beta the stationary point is
    the Gibbs tilt pi_ref exp(R / beta) / Z, which is best-of-n only at beta = 1."""
    values, p_ref, n = VALUES[kind], COUNTS / M, 4
    bon = best_of_n(p_ref, values, n)
    with jax.enable_x64(True):
        at_bon = expected_update(np.log(bon), values, n)
        at_ref = expected_update(np.log(p_ref), values, n)
        # R = log(w_n / n), w_n = (F^n - F_^n) / (F - F_) at the exact CDFs (ties split)
        f = (values[None, :] <= values[:, None]) @ p_ref
        f_below = (values[None, :] < values[:, None]) @ p_ref
        big_r = np.log((f**n - f_below**n) / (f - f_below) / n)
        tilt = p_ref * np.exp(big_r / 2.0)
        tilt /= tilt.sum()
        at_tilt = expected_update(np.log(tilt), values, n, kl_coef=2.0)
        at_bon_beta2 = expected_update(np.log(bon), values, n, kl_coef=2.0)
    np.testing.assert_allclose(at_bon, 0.0, atol=1e-12)
    assert np.abs(at_ref).max() > 1e-2
    np.testing.assert_allclose(at_tilt, 0.0, atol=1e-12)
    assert np.abs(at_bon_beta2).max() > 1e-2
    np.testing.assert_allclose(p_ref * np.exp(big_r) * n, bon, rtol=1e-12)  # R = log(w_n/n)


def test_refusals():
    with pytest.raises(ValueError, match="bon_anchor`=REFERENCE is the anchor of best-of-k"):
        ObjectiveConfig(Objective.MEAN, bon_anchor=BonAnchor.REFERENCE, bon_anchor_samples=4)
    with pytest.raises(ValueError, match="bon_anchor_samples` must be >= 1"):
        ObjectiveConfig(Objective.BON_DISTILL, k=4, bon_anchor="reference")
    with pytest.raises(ValueError, match="only read with bon_anchor=REFERENCE"):
        ObjectiveConfig(Objective.BON_DISTILL, k=4, bon_anchor_samples=4)
    with pytest.raises(ValueError, match="bon_anchor_samples` must be an int >= 0"):
        ObjectiveConfig(Objective.BON_DISTILL, k=4, bon_anchor="reference", bon_anchor_samples=-1)
    with pytest.raises(ValueError, match="BonAnchor"):
        ObjectiveConfig(Objective.BON_DISTILL, k=4, bon_anchor="fixed")
    cfg = reference_cfg(4)
    cfg.check_samples(2)  # the RLOO baseline of the fixed anchor needs N >= 2 only
    with pytest.raises(ValueError, match="N >= 2"):
        cfg.check_samples(1)
    scores = jnp.zeros((2, 4))
    with pytest.raises(ValueError, match="`anchor_scores` .* is required"):
        compute_advantages(cfg, None, scores)
    with pytest.raises(ValueError, match="`anchor_scores` is only read"):
        compute_advantages(ObjectiveConfig(Objective.BON_DISTILL, k=4), None, scores,
                           anchor_scores=scores)  # fmt: skip
    train = TrainConfig(objective=cfg, rl=StepConfig(kl_coef=0.0))
    with pytest.raises(ValueError, match="objective.bon_anchor` is REFERENCE.*rl.kl_coef"):
        train.validate(1)
    ok = TrainConfig(objective=cfg, rl=StepConfig(kl_coef=1.0, kl_estimator=KLEstimator.K2))
    ok.validate(1)
    assert "bon_anchor=REFERENCE" in unsupported(ok)
    assert unsupported(TrainConfig(objective=ObjectiveConfig(Objective.BON_DISTILL, k=4))) is None


def test_defaults_leave_the_run_identity_unchanged():
    """At their defaults the new fields are not in the run's identity (to_json), so existing
    runs resume (a table's fingerprint: tests/experiments/tables/test_bon_frontier_table.py)."""
    from kjax.rl.config import to_json

    moving = TrainConfig(objective=ObjectiveConfig(Objective.BON_DISTILL, k=4))
    assert "bon_anchor" not in str(to_json(moving))
    reference = TrainConfig(objective=reference_cfg(4), rl=StepConfig(kl_coef=1.0))
    assert "bon_anchor" in str(to_json(reference))
