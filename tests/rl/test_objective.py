"""The objective router: one scale (the sum convention) for every objective, config checks.

The decisive test enumerates a softmax bandit: for every objective and k the router's
advantages give E[sum_i A_i grad log pi(y_i)] = grad J_k exactly, with no 1/N left over.
"""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax import objectives
from kjax.objectives import MaxAtKEstimator as E
from kjax.objectives import MeanBaseline
from kjax.rl.objective import (
    KSchedule,
    KScheduleKind,
    Objective,
    ObjectiveConfig,
    compute_advantages,
)
from tests.objectives.helpers import all_outcomes, expected_max_of_k, expected_score_gradient

THETA = np.array([0.4, -0.3, 0.2, -0.1])
LABELS = np.array([0, 1, 1, -1])  # answer 0 is right; 1 and 2 are the same wrong class; 3 abstains
CORRECT = (LABELS == 0).astype(np.float64)
N = 4
# Majority's counting DP is slow op by op; jit it (cfg and k are static, cfg is hashable).
route = jax.jit(compute_advantages, static_argnums=(0, 1))


def vote(classes):
    """maj@k outcome of one subset (docs/estimators.md section 1 semantics), target class 0."""
    counts = collections.Counter(c for c in classes if c >= 0)
    if not counts:
        return 0.0
    top = max(counts.values())
    tied = [c for c, v in counts.items() if v == top]
    return 1.0 / len(tied) if 0 in tied else 0.0


def majority_objective(theta, k):
    outcomes = all_outcomes(len(THETA), k)
    probs = jnp.prod(jax.nn.softmax(theta)[outcomes], axis=-1)
    return jnp.sum(probs * jnp.asarray([vote(LABELS[o]) for o in outcomes]))


def router_gradient(cfg, k):
    outcomes = all_outcomes(len(THETA), N)

    @jax.jit  # one compile instead of many float64 eager kernels
    def grad(theta):
        adv = compute_advantages(
            cfg,
            k,
            jnp.asarray(CORRECT[outcomes]),
            answer_ids=jnp.asarray(LABELS[outcomes], jnp.int32),
            target=jnp.zeros(len(outcomes), jnp.int32),
        )
        return expected_score_gradient(theta, outcomes, adv)

    return grad(jnp.asarray(THETA))


CASES = [(ObjectiveConfig(Objective.MEAN), 1)]
CASES += [
    (ObjectiveConfig(Objective.MAX_AT_K, k=k, max_at_k_estimator=e), k)
    for k, e in [(1, E.LOO_MINUS_ONE), (2, E.S), (3, E.LOO), (4, E.LOO_MINUS_ONE)]
]
CASES += [(ObjectiveConfig(Objective.MAJORITY_AT_K, k=k), k) for k in (3,)]
MIXTURE = ((1, 0.5), (3, 2.0))
CASES += [(ObjectiveConfig(Objective.MAX_AT_K_MIXTURE, mixture_weights=MIXTURE), None)]


def case_id(case):
    cfg, k = case
    return f"{cfg.objective.name}-{cfg.max_at_k_estimator.name}-k{k or ''}"


@pytest.mark.parametrize(("cfg", "k"), CASES, ids=[case_id(c) for c in CASES])
def test_every_objective_is_in_the_sum_convention(cfg, k):
    with jax.enable_x64(True):
        got = router_gradient(cfg, k)
        if cfg.objective is Objective.MAJORITY_AT_K:
            objective = lambda t: majority_objective(t, k)
        elif cfg.objective is Objective.MAX_AT_K_MIXTURE:
            objective = lambda t: sum(w * expected_max_of_k(t, CORRECT, j) for j, w in MIXTURE)
        else:  # MEAN is J_1 = E[r]
            objective = lambda t: expected_max_of_k(t, CORRECT, k)
        want = jax.jit(jax.grad(objective))(jnp.asarray(THETA))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def scores(seed=0, b=5, n=6):
    return jnp.asarray(np.random.default_rng(seed).uniform(0, 1, (b, n)), jnp.float32)


@pytest.mark.parametrize("estimator", [E.LOO_MINUS_ONE, E.CENTERED])
def test_max_at_1_equals_mean_rloo_after_routing(estimator):
    """k-annealing 8 -> 1 lands on RLOO at the same scale."""
    r = scores()
    mean = compute_advantages(ObjectiveConfig(Objective.MEAN), 1, r)
    cfg = ObjectiveConfig(Objective.MAX_AT_K, k=8, max_at_k_estimator=estimator)
    np.testing.assert_allclose(compute_advantages(cfg, 1, r), mean, rtol=1e-6, atol=1e-7)
    rloo = np.asarray(r) - (np.asarray(r).sum(1, keepdims=True) - np.asarray(r)) / 5
    np.testing.assert_allclose(mean, rloo / 6, rtol=1e-5, atol=1e-7)  # N = 6


def test_centered_majority_at_1_is_dr_grpo():
    """Centred maj@1 advantages are (correct_i - mean) / N: Dr.GRPO after routing."""
    rng = np.random.default_rng(1)
    answers = jnp.asarray(rng.integers(-1, 3, (6, 5)), jnp.int32)
    target = jnp.asarray(rng.integers(0, 3, 6), jnp.int32)
    correct = (answers == target[:, None]).astype(jnp.float32)
    cfg = ObjectiveConfig(Objective.MAJORITY_AT_K, majority_centered=True)
    centered = route(cfg, 1, correct, answers, target)
    dr_grpo = ObjectiveConfig(Objective.MEAN, mean_baseline=MeanBaseline.GROUP_MEAN)
    np.testing.assert_allclose(centered, compute_advantages(dr_grpo, 1, correct), atol=1e-7)


def test_chen_analytic_enters_the_sum_convention_like_mean():
    """Chen et al.'s advantage is per-sample normalised: at k = 1 on binary rewards it is
    GRPO's z-score, so after routing it must equal MEAN with GROUP_ZSCORE (both / N)."""
    rng = np.random.default_rng(7)
    correct = jnp.asarray(rng.integers(0, 2, (6, 5)), jnp.float32)
    chen = ObjectiveConfig(Objective.MAX_AT_K, k=1, max_at_k_estimator=E.CHEN_ANALYTIC)
    grpo = ObjectiveConfig(Objective.MEAN, mean_baseline=MeanBaseline.GROUP_ZSCORE)
    np.testing.assert_allclose(
        compute_advantages(chen, 1, correct), compute_advantages(grpo, 1, correct), atol=1e-5
    )
    raw = objectives.max_at_k_advantages(correct, 3, E.CHEN_ANALYTIC)
    np.testing.assert_allclose(compute_advantages(chen, 3, correct), raw / 5, rtol=1e-6)


def test_mixture_is_the_weighted_sum_of_its_ks():
    r = scores(4, n=6)
    weights = ((1, 0.5), (3, 2.0))
    cfg = ObjectiveConfig(Objective.MAX_AT_K_MIXTURE, mixture_weights=weights)
    want = sum(
        w * compute_advantages(ObjectiveConfig(Objective.MAX_AT_K, k=k), k, r) for k, w in weights
    )
    np.testing.assert_allclose(route(cfg, None, r), want, rtol=1e-5, atol=1e-6)
    maxrl = ObjectiveConfig(Objective.MAX_AT_K_MIXTURE, maxrl_t=3)
    want = sum(
        compute_advantages(ObjectiveConfig(Objective.MAX_AT_K, k=k), k, r) / k for k in (1, 2, 3)
    )
    np.testing.assert_allclose(route(maxrl, None, r), want, rtol=1e-5, atol=1e-6)


def test_router_under_jit_matches_eager():
    r = scores(5, b=3)
    for cfg, k in [
        (ObjectiveConfig(Objective.MAX_AT_K, k=4), 4),
        (ObjectiveConfig(Objective.MAX_AT_K, k=4), 2),
        (ObjectiveConfig(Objective.MEAN, mean_baseline=MeanBaseline.GROUP_ZSCORE), None),
    ]:
        np.testing.assert_allclose(
            route(cfg, k, r), compute_advantages(cfg, k, r), rtol=1e-6, atol=1e-7
        )


def test_config_coerces_strings_and_names_bad_fields():
    cfg = ObjectiveConfig("max_at_k", k=4, max_at_k_estimator="LOO")
    assert cfg.objective is Objective.MAX_AT_K and cfg.max_at_k_estimator is E.LOO
    assert hash(cfg) == hash(ObjectiveConfig(Objective.MAX_AT_K, 4, max_at_k_estimator=E.LOO))
    bad = [
        (dict(objective="pass_at_k"), "ObjectiveConfig.objective"),
        (dict(mean_baseline="ppo"), "ObjectiveConfig.mean_baseline"),
        (dict(objective=Objective.MAX_AT_K, max_at_k_estimator=3), "max_at_k_estimator"),
        (dict(objective=Objective.MAX_AT_K, k=0), "ObjectiveConfig.k"),
        (dict(objective=Objective.MAX_AT_K, k=2.0), "ObjectiveConfig.k"),
        (dict(k=4), "ObjectiveConfig.k"),  # MEAN is k = 1
        (dict(majority_centered=1), "majority_centered"),
        (dict(objective=Objective.MAX_AT_K_MIXTURE), "mixture_weights"),  # neither set
        (
            dict(objective=Objective.MAX_AT_K_MIXTURE, mixture_weights=((2, 1.0),), maxrl_t=4),
            "mixture_weights",
        ),  # both set
        (dict(objective=Objective.MAX_AT_K_MIXTURE, mixture_weights=((2, -1.0),)), ">= 0"),
        (
            dict(
                objective=Objective.MAX_AT_K_MIXTURE, maxrl_t=2, max_at_k_estimator=E.CHEN_ANALYTIC
            ),
            "CHEN_ANALYTIC",
        ),
        (dict(objective=Objective.MAX_AT_K, maxrl_t=2), "only read by"),
        (dict(objective=Objective.MAX_AT_K_MIXTURE, maxrl_t=2, k=2), "ObjectiveConfig.k"),
    ]
    for kwargs, field in bad:
        with pytest.raises(ValueError, match=field):
            ObjectiveConfig(**kwargs)


def test_check_samples_catches_k_above_n():
    ObjectiveConfig(Objective.MAX_AT_K, k=8).check_samples(8)
    with pytest.raises(ValueError, match=r"ObjectiveConfig.k.*N=4"):
        ObjectiveConfig(Objective.MAX_AT_K, k=8).check_samples(4)
    with pytest.raises(ValueError, match="LOO needs N >= 9"):
        ObjectiveConfig(Objective.MAX_AT_K, k=8, max_at_k_estimator=E.LOO).check_samples(8)
    with pytest.raises(ValueError, match="k=5 > N=4"):
        ObjectiveConfig(Objective.MAJORITY_AT_K, k=5).check_samples(4)
    with pytest.raises(ValueError, match="RLOO needs N >= 2"):
        ObjectiveConfig().check_samples(1)
    anneal = KSchedule(KScheduleKind.STEP, k_start=16, k_end=1, steps=100)
    with pytest.raises(ValueError, match="KSchedule"):
        ObjectiveConfig(Objective.MAX_AT_K, k=1).check_samples(8, anneal)
    maxrl = ObjectiveConfig(Objective.MAX_AT_K_MIXTURE, maxrl_t=8)
    maxrl.check_samples(8)
    with pytest.raises(ValueError, match=r"mixture_weights/maxrl_t.*k=8 > N=4"):
        maxrl.check_samples(4)
    with pytest.raises(ValueError, match="LOO needs N >= 9"):
        dataclasses.replace(maxrl, max_at_k_estimator=E.LOO).check_samples(8)
    with pytest.raises(ValueError, match="k_schedule"):
        maxrl.check_samples(8, anneal)
    if hasattr(E, "L2O"):  # N > k, like LOO
        with pytest.raises(ValueError, match="L2O needs N >= 5"):
            ObjectiveConfig(Objective.MAX_AT_K, k=4, max_at_k_estimator=E.L2O).check_samples(4)


def test_compute_advantages_input_errors():
    r = scores()
    with pytest.raises(ValueError, match="answer_ids"):
        compute_advantages(ObjectiveConfig(Objective.MAJORITY_AT_K), 1, r)
    with pytest.raises(ValueError, match="scores"):
        compute_advantages(ObjectiveConfig(), 1, r[0])
    with pytest.raises(ValueError, match="k"):
        compute_advantages(ObjectiveConfig(Objective.MAX_AT_K), 9, r)  # N = 6


def test_k_schedules():
    assert [KSchedule(k_start=4)(s) for s in (0, 10**6)] == [4, 4]
    lin = KSchedule(KScheduleKind.LINEAR, k_start=8, k_end=1, steps=7)
    assert [lin(s) for s in range(10)] == [8, 7, 6, 5, 4, 3, 2, 1, 1, 1]
    slow = KSchedule("linear", k_start=1, k_end=4, steps=100)
    # k(s) = floor(1 + 3 s / 100 + 1/2): 1.48 -> 1, 1.51 -> 2, 2.5 -> 3.
    assert [slow(s) for s in (16, 17, 50, 100, 200)] == [1, 2, 3, 4, 4]
    assert slow.values() == (1, 2, 3, 4)
    fast = KSchedule(KScheduleKind.LINEAR, k_start=1, k_end=8, steps=2)
    assert [fast(s) for s in range(3)] == [1, 5, 8] and fast.values() == (1, 5, 8)
    step = KSchedule(KScheduleKind.STEP, k_start=8, k_end=1, steps=10)
    assert [step(s) for s in (0, 9, 10, 11)] == [8, 8, 1, 1] and step.values() == (1, 8)
    assert all(type(sched(3)) is int for sched in (lin, slow, step))
    for kwargs, field in [
        (dict(kind="cosine"), "KSchedule.kind"),
        (dict(k_start=0), "KSchedule.k_start"),
        (dict(k_start=2, k_end=1), "KSchedule.k_end"),  # CONSTANT cannot anneal
        (dict(kind=KScheduleKind.LINEAR, k_start=8, k_end=1, steps=0), "KSchedule.steps"),
    ]:
        with pytest.raises(ValueError, match=field):
            KSchedule(**kwargs)
    with pytest.raises(ValueError, match="step"):
        lin(-1)


def test_k_annealing_never_retraces_per_step_only_per_k():
    traces = []

    def adv(cfg, k, r):
        traces.append(k)
        return compute_advantages(cfg, k, r)

    fn = jax.jit(adv, static_argnums=(0, 1))
    sched = KSchedule(KScheduleKind.STEP, k_start=4, k_end=1, steps=3)
    cfg = ObjectiveConfig(Objective.MAX_AT_K, k=4)
    for s in range(6):
        fn(cfg, sched(s), scores(s))
    assert traces == [4, 1]  # one trace per distinct k, none per step
    assert sched.values() == (1, 4)


def test_objective_value_is_the_enumerated_objective():
    """objective_value against the subset-enumeration oracles, for every kind of objective."""
    from kjax.objectives import reference, reference_majority
    from kjax.rl.objective import objective_ks, objective_value

    rng = np.random.default_rng(3)
    scores = rng.uniform(size=(5, 6))
    answers = rng.integers(-1, 3, size=(5, 6))
    target = np.zeros(5, np.int64)
    cases = [
        (ObjectiveConfig(Objective.MEAN), 1, reference.max_at_k_ref(scores, 1).mean()),
        (ObjectiveConfig(Objective.MAX_AT_K, k=4), 4, reference.max_at_k_ref(scores, 4).mean()),
        (
            ObjectiveConfig(Objective.MAJORITY_AT_K, k=3),
            3,
            reference_majority.majority_at_k_ref(answers, target, 3).mean(),
        ),
        (
            ObjectiveConfig(Objective.MAX_AT_K_MIXTURE, k=1, maxrl_t=3),
            None,
            sum(reference.max_at_k_ref(scores, j).mean() / j for j in (1, 2, 3)),
        ),
    ]
    for cfg, k, want in cases:
        got = objective_value(cfg, k, jnp.asarray(scores, jnp.float32), answers, target)
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=cfg.objective.name)
    mixture = cases[-1][0]
    assert objective_ks(mixture) == (1, 2, 3)
    with pytest.raises(ValueError, match="k = 8 > N = 6"):
        objective_value(ObjectiveConfig(Objective.MAX_AT_K, k=8), None, scores)
