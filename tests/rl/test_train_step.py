"""The jitted RL update against losses written out here on unpadded sequences, one at a time.

Every combination of {PG, PPO} x {1, 2 epochs} x {1, 2 minibatches} x {MEAN, MAX_AT_K
LOO_MINUS_ONE, MAJORITY_AT_K} either ends with the parameters a hand-written SGD loop over
the same updates reaches (advantages from the enumeration oracles), or is refused when
configured. Step functions are compiled once per StepConfig and shared.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kjax import objectives
from kjax.models import llama
from kjax.objectives import MaxAtKEstimator, MeanBaseline, reference_majority
from kjax.objectives import reference as ref_lib
from kjax.rl.config import (
    KLEstimator,
    KSchedule,
    KScheduleKind,
    LossAggregation,
    Objective,
    ObjectiveConfig,
    OffPolicyMaxAtK,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.rl.objective import compute_advantages, offpolicy_reweighter
from kjax.rl.train_step import init_train_state, make_train_step, shardings_of
from tests.rl.rl_helpers import CONFIG, mesh, random_batch, tiny_params

B, N, T, K = 4, 3, 4, 2
LR = 0.5
EPS = 0.2


def _batch_with_answers(seed=0):
    """A rollout batch whose scores are maj@k-consistent: score = (answer == target)."""
    batch = random_batch(B=B, N=N, T=T, seed=seed)
    rng = np.random.default_rng(seed + 100)
    answers = rng.integers(-1, 3, size=(B, N)).astype(np.int32)
    target = rng.integers(0, 3, size=B).astype(np.int32)
    scores = (answers == target[:, None]).astype(np.float32)
    return batch._replace(scores=jnp.asarray(scores)), answers, target


BATCH, ANSWERS, TARGET = _batch_with_answers()

# objective -> (config, oracle advantages in the sum convention, float64).
OBJECTIVES = {
    "mean": (
        ObjectiveConfig(),
        lambda: ref_lib.mean_advantages_ref(BATCH.scores, MeanBaseline.RLOO) / N,
    ),
    "max_at_k": (
        ObjectiveConfig(Objective.MAX_AT_K, k=K),
        lambda: ref_lib.max_at_k_advantages_ref(BATCH.scores, K, MaxAtKEstimator.LOO_MINUS_ONE),
    ),
    "majority": (
        ObjectiveConfig(Objective.MAJORITY_AT_K, k=K),
        lambda: reference_majority.majority_at_k_advantages_ref(ANSWERS, TARGET, K),
    ),
}


def _unpadded(batch):
    """Each completion as its own sequence, prompt (padding removed) + completion, right-
    padded to S + T: (ids [B*N, S+T], real [B*N, S+T], index [B,N,T] of the position
    predicting each completion token). Causal attention never looks right, so the
    right padding cannot change a real position's logits."""
    batch = jax.tree.map(np.asarray, batch)
    Bb, Nb, Tb = batch.tokens.shape
    L = batch.prompts.shape[1] + Tb
    ids, real = np.zeros((Bb * Nb, L), np.int32), np.zeros((Bb * Nb, L), bool)
    index = np.zeros((Bb, Nb, Tb), np.int32)
    for b in range(Bb):
        prompt = batch.prompts[b][batch.prompt_mask[b]]
        for i in range(Nb):
            seq = np.concatenate([prompt, batch.tokens[b, i][batch.mask[b, i]]])
            ids[b * Nb + i, : len(seq)], real[b * Nb + i, : len(seq)] = seq, True
            index[b, i] = np.minimum(len(prompt) - 1 + np.arange(Tb), L - 1)
    return ids, real, index


def _token_logits(params, batch):
    """Logits [B,N,T,V] predicting each completion token (meaningless past its length)."""
    ids, real, index = _unpadded(batch)
    Bb, Nb, Tb = index.shape
    logits = llama.forward(params, CONFIG, jnp.asarray(ids), attention_mask=jnp.asarray(real))
    logits = logits.reshape(Bb, Nb, ids.shape[1], -1)
    return jnp.take_along_axis(logits, jnp.asarray(index)[..., None], axis=2)


def _token_logprobs(params, batch):
    """log pi [B,N,T] of each completion token, 0 past the completion's length."""
    logp = jax.nn.log_softmax(_token_logits(params, batch), axis=-1)
    lp = jnp.take_along_axis(logp, jnp.asarray(batch.tokens)[..., None], axis=-1)[..., 0]
    return jnp.where(batch.mask, lp, 0.0)


# Batches the hand-written runs close over (concrete: they fix every sequence's length).
OFF_B, OFF_N, OFF_K = 2, 8, 8
OFF_BATCH = random_batch(B=OFF_B, N=OFF_N, T=T, seed=5)
BATCHES = {"matrix": BATCH, "offpolicy": OFF_BATCH}


@functools.cache
def _reference_grad(ppo: bool, which: str = "matrix", sequence: bool = False):
    """Jitted grad of the written loss of one update over the rows with weight w [B]:
    PG:  -sum_b w_b sum_i A_bi sum_t log pi(y_bit)
    PPO: -sum_b w_b sum_i sum_t min(rho A, clip(rho, 1-eps, 1+eps) A), rho = pi/pi_old
      per token; with `sequence`, -sum_b w_b sum_i min(rho A, clip(rho) A) with rho the
      ratio of the whole sequence's probabilities."""
    batch = BATCHES[which]

    def loss(params, adv, old, w):
        lp = _token_logprobs(params, batch)
        if sequence:
            rho = jnp.exp(jnp.sum(jnp.where(batch.mask, lp - old, 0.0), axis=-1))
            obj = jnp.minimum(rho * adv, jnp.clip(rho, 1 - EPS, 1 + EPS) * adv)
            return -jnp.sum(w * jnp.sum(obj, axis=1))
        a = adv[..., None]
        if ppo:
            rho = jnp.exp(jnp.where(batch.mask, lp - old, 0.0))
            obj = jnp.minimum(rho * a, jnp.clip(rho, 1 - EPS, 1 + EPS) * a)
        else:
            obj = a * lp
        per_sample = jnp.sum(jnp.where(batch.mask, obj, 0.0), axis=-1)
        return -jnp.sum(w * jnp.sum(per_sample, axis=1))

    return jax.jit(jax.grad(loss))


@functools.cache
def _reference_logprobs(which: str):
    return jax.jit(lambda p: _token_logprobs(p, BATCHES[which]))


def _hand_written_run(cfg: StepConfig, adv, which="matrix", reweight=None):
    """Final params of the SGD loop over epochs x minibatches; minibatch m holds rows
    m, m + M, m + 2M, ... (the train step's interleaved split, which keeps each device's
    block of B on that device). reweight(rows, log_ratio [rows, N]) -> advantages of
    every update after the first, log_ratio against the starting params."""
    params = tiny_params()
    logprobs = _reference_logprobs(which)
    old = logprobs(params)
    mask = np.asarray(BATCHES[which].mask)
    Bb, M = old.shape[0], cfg.minibatches
    grad = _reference_grad(
        cfg.loss is PolicyLoss.PPO, which, cfg.ratio_level is RatioLevel.SEQUENCE
    )
    adv = np.asarray(adv, np.float64)
    for e in range(cfg.epochs):
        for m in range(M):
            rows = (np.arange(Bb) % M) == m
            a = adv
            if reweight is not None and (e, m) != (0, 0):
                log_ratio = np.where(mask, logprobs(params) - old, 0.0).sum(-1)
                a = np.zeros_like(adv)
                a[rows] = reweight(rows, log_ratio[rows])
            w = jnp.asarray(rows / rows.sum(), jnp.float32)
            g = grad(params, jnp.asarray(a, jnp.float32), old, w)
            params = jax.tree.map(lambda p, g: p - LR * g, params, g)
    return params


TRACES = []  # one entry per optimizer update traced (the step wraps none of this)


def _counting(opt: optax.GradientTransformation) -> optax.GradientTransformation:
    """opt whose update notes each time it is traced (called only while tracing the jit)."""

    def update(*args, **kwargs):
        TRACES.append(1)
        return opt.update(*args, **kwargs)

    return optax.GradientTransformation(opt.init, update)


@functools.cache
def _step(cfg: StepConfig, devices: int = 2, objective=None, ks=()):
    m = mesh(devices)
    opt = _counting(optax.sgd(LR))
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    reweight = offpolicy_reweighter(objective, cfg, ks) if objective is not None else None
    return make_train_step(CONFIG, cfg, opt, m, shardings_of(state), reweight=reweight), opt, m


def _run(cfg: StepConfig, batch, ref_params=None, k=K, devices=2, objective=None, ks=()):
    fn, opt, m = _step(cfg, devices, objective, ks)
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    return fn(state, batch, ref_params, np.int32(k))


def _assert_params_close(got, want, rtol=5e-5, atol=5e-6):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


# The default tier runs the extremes (PG 1 x 1, PPO 2 x 2) and every refusal; the other
# PPO shapes cost a compile each and run in the slow tier.
DEFAULT_TIER = {(PolicyLoss.PG, 1, 1), (PolicyLoss.PPO, 2, 2)}


def _case(loss, epochs, minibatches, name):
    refused = loss is PolicyLoss.PG  # PG with reuse is refused at once: no compile
    cheap = refused or (loss, epochs, minibatches) in DEFAULT_TIER
    case_id = f"{loss.name}-e{epochs}-m{minibatches}-{name}"
    marks = () if cheap else pytest.mark.slow
    return pytest.param(loss, epochs, minibatches, name, id=case_id, marks=marks)


MATRIX = [
    _case(loss, epochs, minibatches, name)
    for loss in PolicyLoss
    for epochs in (1, 2)
    for minibatches in (1, 2)
    for name in OBJECTIVES
]


@pytest.mark.parametrize(("loss", "epochs", "minibatches", "name"), MATRIX)
def test_update_is_the_written_loss_or_refused(loss, epochs, minibatches, name):
    kwargs = dict(loss=loss, epochs=epochs, minibatches=minibatches, ppo_epsilon=EPS)
    if loss is PolicyLoss.PG and epochs * minibatches > 1:
        with pytest.raises(ValueError, match=r"rl.loss.*=PG.*Use rl.loss=PPO"):
            StepConfig(**kwargs)
        return
    cfg = StepConfig(**kwargs)
    objective, oracle = OBJECTIVES[name]
    adv = compute_advantages(objective, None, BATCH.scores, ANSWERS, TARGET)
    np.testing.assert_allclose(adv, oracle(), rtol=1e-5, atol=1e-6)  # the loop's router
    state, metrics = _run(cfg, BATCH._replace(advantages=adv))
    _assert_params_close(state.params, _hand_written_run(cfg, oracle()))
    assert bool(metrics["finite"]) and int(state.step) == 1


@pytest.mark.slow
def test_microbatches_accumulate_one_update():
    _, oracle = OBJECTIVES["max_at_k"]
    adv = jnp.asarray(oracle(), jnp.float32)
    state, _ = _run(StepConfig(microbatches=2), BATCH._replace(advantages=adv), devices=1)
    _assert_params_close(state.params, _hand_written_run(StepConfig(), oracle()))


def test_kl_to_a_different_reference_and_entropy_follow_the_aggregation():
    estimator = KLEstimator.K3  # K2's gradient is checked against enumeration in test_losses
    # Reference params differ from the policy, so the KL term has a non-zero gradient.
    agg = LossAggregation.SEQ_MEAN_TOKEN_MEAN
    cfg = StepConfig(aggregation=agg, kl_coef=0.5, kl_estimator=estimator, entropy_coef=0.1)
    ref_params = tiny_params(seed=1)
    adv = jnp.asarray(OBJECTIVES["mean"][1](), jnp.float32)
    state, metrics = _run(cfg, BATCH._replace(advantages=adv), ref_params=ref_params)
    length = np.maximum(np.asarray(BATCH.mask).sum(-1), 1)  # L_bi

    def loss(params):
        logits = _token_logits(params, BATCH)
        logp_all = jax.nn.log_softmax(logits, axis=-1)
        lp = jnp.take_along_axis(logp_all, BATCH.tokens[..., None], axis=-1)[..., 0]
        ref = _token_logprobs(ref_params, BATCH)
        log_r = jax.lax.stop_gradient(ref) - lp
        kl = (log_r**2 / 2) if estimator is KLEstimator.K2 else (jnp.exp(log_r) - 1 - log_r)
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)

        def per_seq(x):  # GRPO's per-token mean of each sequence
            return jnp.sum(jnp.where(BATCH.mask, x, 0.0), axis=-1) / length

        pg = -jnp.mean(jnp.sum(adv * per_seq(lp), axis=1))
        return pg + 0.5 * jnp.mean(per_seq(kl)) - 0.1 * jnp.mean(per_seq(entropy))

    g = jax.jit(jax.grad(loss))(tiny_params())
    _assert_params_close(state.params, jax.tree.map(lambda p, g: p - LR * g, tiny_params(), g))
    assert float(metrics["kl"]) > 0 and float(metrics["entropy"]) > 0


@pytest.mark.slow
def test_sharded_over_four_devices_is_the_same_update():
    cfg = StepConfig(loss=PolicyLoss.PPO, epochs=2, ppo_epsilon=EPS)
    _, oracle = OBJECTIVES["max_at_k"]
    state, _ = _run(cfg, BATCH._replace(advantages=jnp.asarray(oracle(), jnp.float32)), devices=4)
    _assert_params_close(state.params, _hand_written_run(cfg, oracle()))
    assert state.params["layers"]["q"].sharding.mesh.size == min(4, jax.device_count())


def test_state_is_donated_and_bad_splits_are_refused():
    fn, opt, m = _step(StepConfig())
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    new, _ = fn(state, BATCH, None, np.int32(K))
    assert state.params["embed"].is_deleted() and int(new.step) == 1
    bad = make_train_step(CONFIG, StepConfig(microbatches=3), opt, m, shardings_of(new))
    with pytest.raises(ValueError, match="minibatches"):  # raised while tracing
        bad(new, BATCH, None, np.int32(K))


def _offpolicy_case(mode: OffPolicyMaxAtK, k: int, estimator=MaxAtKEstimator.LOO_MINUS_ONE):
    """(trainer params, hand-written params) after one PPO step of 2 epochs with off-policy
    max@k re-weighting; the trainer's reweighter serves both k of an 8 -> 1 schedule."""
    cfg = StepConfig(
        loss=PolicyLoss.PPO,
        epochs=2,
        ppo_epsilon=EPS,
        ratio_level=RatioLevel.SEQUENCE,
        offpolicy_max_at_k=mode,
    )
    objective = ObjectiveConfig(Objective.MAX_AT_K, k=OFF_K, max_at_k_estimator=estimator)
    adv = objectives.max_at_k_advantages(OFF_BATCH.scores, k, estimator)
    state, metrics = _run(
        cfg, OFF_BATCH._replace(advantages=adv), k=k, devices=2, objective=objective, ks=(1, OFF_K)
    )
    exact = mode is OffPolicyMaxAtK.EXACT

    def reweight(rows, log_ratio):
        scores = jnp.asarray(OFF_BATCH.scores)[rows]
        return objectives.max_at_k_offpolicy_advantages(
            scores, jnp.asarray(log_ratio, jnp.float32), k, estimator=estimator, exact=exact
        )

    want = _hand_written_run(cfg, adv, "offpolicy", reweight)
    return state, metrics, want


@pytest.mark.parametrize("k", [OFF_K, 1])
def test_offpolicy_max_at_k_reweights_the_second_epoch(k):
    state, metrics, want = _offpolicy_case(OffPolicyMaxAtK.EXACT, k)
    _assert_params_close(state.params, want)
    assert bool(metrics["finite"])


@pytest.mark.slow
def test_linear_offpolicy_max_at_k_reweights_the_second_epoch():
    state, _, want = _offpolicy_case(OffPolicyMaxAtK.LINEAR, OFF_K, MaxAtKEstimator.S)
    _assert_params_close(state.params, want)


def test_a_k_schedule_never_retraces_the_update():
    # 8 -> 1 with the off-policy option on: k reaches the jit as a traced scalar.
    cfg = StepConfig(
        loss=PolicyLoss.PPO,
        epochs=2,
        ppo_epsilon=EPS,
        ratio_level=RatioLevel.SEQUENCE,
        offpolicy_max_at_k=OffPolicyMaxAtK.EXACT,
    )
    objective = ObjectiveConfig(Objective.MAX_AT_K, k=OFF_K)
    schedule = KSchedule(KScheduleKind.STEP, k_start=OFF_K, k_end=1, steps=3)
    fn, opt, m = _step(cfg, 2, objective, schedule.values())
    state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
    seen = []
    for step in range(6):
        k = schedule(step)
        adv = objectives.max_at_k_advantages(OFF_BATCH.scores, k, MaxAtKEstimator.LOO_MINUS_ONE)
        state, metrics = fn(state, OFF_BATCH._replace(advantages=adv), None, np.int32(k))
        seen.append(len(TRACES))
    assert [schedule(s) for s in range(6)] == [8, 8, 8, 1, 1, 1]
    assert seen[1:] == [seen[0]] * 5  # no call after the first traced the update again
    assert fn._cache_size() == 1
    assert int(state.step) == 6 and bool(metrics["finite"])


@pytest.mark.gpu
def test_update_on_the_accelerator():
    # Same identity on GPU/TPU, at full float32 matmul precision (no TF32 / bf16 passes).
    with jax.default_matmul_precision("highest"):
        test_update_is_the_written_loss_or_refused(PolicyLoss.PPO, 2, 2, "max_at_k")
        test_state_is_donated_and_bad_splits_are_refused()
