"""Stale rollouts (StepConfig.policy_lag = d): LagCorrection.EXACT's expected update is grad J
of the current policy; TIS and NONE are biased, by the amounts stated below.

Setup (as tests/rl/test_offpolicy_exact_update.py): a two-token autoregressive tabular
policy over a 3-token vocabulary (9 sequences, continuous distinct rewards), in float64. A
chain of policy versions theta_0 -> ... -> theta_4, each step 0.2 * (a fixed drift + fresh
noise) on every logit, stands for the parameters of successive RL steps; the current policy
is theta_4 and the behaviour policy of a rollout with lag d is mu = theta_{4-d}. For every
group y_1..y_N (N = 3, all 729) drawn from mu, with weight prod_i mu(y_i), the batch is
what the asynchronous loop hands the update: sampler_logprobs = mu's token log-probs and
advantages = kjax.rl.objective.compute_advantages of the group's rewards (the on-policy
advantages computed at sampling time). The expected update is the mu-weighted sum of
-grad_theta kjax.rl.train_step.loss_of_logprobs (rl.loss=PG unless said; old_logprobs =
the current policy's log-probs as constants, what the loop's step-start forward gives TIS).
The reference is grad J of theta_4 from the definition, by enumerating k-tuples (J_1 = E[r]
for MEAN, J_2 = E[max of 2] for max@2): no kjax advantage, ratio or loss code. The error is
||got - want|| / ||want|| over the policy's 12 logits.

EXACT (the others' sequence ratios against mu via offpolicy_reweighter, PG weighted by the
own sequence ratio rho_i; for MEAN with RLOO, rho_i alone) is exact (< 1e-9; measured
<= 1e-14) for MEAN and max@2 with S, LOO_MINUS_ONE and L2O at d = 1, 2 and 4 (largest
sequence ratio pi/mu 1.39, 1.72, 3.22), with PG and with decoupled PPO (weight
pi_start / mu, ratio pi / pi_start clipped around the step's start): on a step's first
update, and on a later one whose ratios stay inside the clip (epsilon 0.9); at epsilon
0.02 the clip binds and the later update is not grad J (error > 1%).

Stated biases (relative errors, each tested to within 10%), objective MEAN (RLOO) or max@2
(MAX2-<estimator>, LOO_M1 = LOO_MINUS_ONE), N = 3:
  TIS           rl.lag_correction=TIS, rl.tis_cap=1.25: per-token weights min(pi/mu, 1.25);
                the cap binds (the largest per-token ratio is 1.37 at d = 1, 1.51 at d = 2).
  TIS-uncapped  the same with tis_cap=1e9, which never binds.
  SEQ-uncapped  one per-sequence weight pi(y)/mu(y), never truncated (rl.loss=PPO,
                ratio_level=SEQUENCE, one update, tis_cap=1e9).
  NONE          rl.lag_correction=NONE.

    objective        d    TIS     TIS-uncapped   SEQ-uncapped   NONE
    MEAN             1    0.142   0.131          exact          0.160
    MEAN             2    0.179   0.146          exact          0.276
    MAX2-S           1    0.235   0.209          0.175          1.37
    MAX2-S           2    0.476   0.181          0.191          1.92
    MAX2-LOO_M1      1    0.176   0.209          0.175          0.433
    MAX2-LOO_M1      2    0.218   0.181          0.191          0.764
    MAX2-L2O         1    0.191   0.209          0.175          0.268
    MAX2-L2O         2    0.166   0.181          0.191          0.345

What this shows (the amounts are this toy's and move a lot with the policies: other
chains of the same size give 2% to 48% for MEAN's TIS; that TIS and NONE are biased and
EXACT is not does not change):
  - TIS is biased for the mean objective too, and not only by its truncation: uncapped,
    a per-token weight pi(y_t | y_<t) / mu(y_t | y_<t) multiplies token t's score, whose
    correct weight (the advantage depends on the whole sequence) is the sequence ratio,
    the product over all tokens. Truncating can move the error either way (max@2 LOO_M1,
    L2O at d = 1: smaller capped than uncapped).
  - Uncapped, the three max@2 estimators' errors coincide, per token and per sequence:
    their advantages differ by terms of the other samples only, which multiply a
    weighted score whose expectation under mu is 0 (E_mu[w_t grad log pi(y_t | y_<t)]
    = E_pi[grad log pi(y_t | y_<t)] = 0), so the bias is the one the estimators share.
  - One untruncated sequence ratio per sample fixes MEAN (RLOO's baseline does not depend
    on y_i) but not max@k: sample i's advantage depends on the OTHER samples, drawn from
    mu too, which is what EXACT's re-weighting by their ratios corrects.
  - NONE is the most biased in every case here, and more so at d = 2 than at d = 1.
"""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.objectives import MaxAtKEstimator
from kjax.rl.config import (
    LagCorrection,
    MeanBaseline,
    Objective,
    ObjectiveConfig,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.rl.objective import compute_advantages, offpolicy_reweighter
from kjax.rl.train_step import RLBatch, loss_of_logprobs

V, T, N = 3, 2, 3
VERSIONS, MOVE = 4, 0.2  # theta_0 .. theta_4; the current policy is the last
TIS_CAP, UNCAPPED = 1.25, 1e9
TOLERANCE = 0.10  # a measured bias must lie within 10% of the stated one

SEQUENCES = np.array(list(itertools.product(range(V), repeat=T)))  # [V**T, T]
GROUPS = np.array(list(itertools.product(range(len(SEQUENCES)), repeat=N)))  # [G, N]
REWARDS = np.random.default_rng(7).uniform(size=len(SEQUENCES))  # continuous, distinct

OBJECTIVES = {  # name in the docstring's table -> (ObjectiveConfig, k)
    "MEAN": (ObjectiveConfig(Objective.MEAN, mean_baseline=MeanBaseline.RLOO), 1),
    "MAX2-S": (ObjectiveConfig(Objective.MAX_AT_K, k=2, max_at_k_estimator=MaxAtKEstimator.S), 2),
    "MAX2-LOO_M1": (
        ObjectiveConfig(Objective.MAX_AT_K, k=2, max_at_k_estimator=MaxAtKEstimator.LOO_MINUS_ONE),
        2,
    ),
    "MAX2-L2O": (
        ObjectiveConfig(Objective.MAX_AT_K, k=2, max_at_k_estimator=MaxAtKEstimator.L2O),
        2,
    ),
}

CORRECTIONS = {  # column of the docstring's table -> StepConfig fields besides policy_lag
    "TIS": dict(lag_correction=LagCorrection.TIS, tis_cap=TIS_CAP),
    "TIS-uncapped": dict(lag_correction=LagCorrection.TIS, tis_cap=UNCAPPED),
    "SEQ-uncapped": dict(
        loss=PolicyLoss.PPO,
        ratio_level=RatioLevel.SEQUENCE,
        lag_correction=LagCorrection.TIS,
        tis_cap=UNCAPPED,
    ),
    "NONE": dict(lag_correction=LagCorrection.NONE),
}


def _stated() -> dict[tuple[str, int, str], float | None]:
    """The docstring's table: (objective, d, column) -> stated relative error (None: exact)."""
    rows = re.findall(r"^ {4}(MEAN|MAX2-\S+) +(\d+) +(.+)$", __doc__, re.MULTILINE)
    table = {}
    for name, d, cells in rows:
        for column, cell in zip(CORRECTIONS, cells.split(), strict=True):
            table[name, int(d), column] = None if cell == "exact" else float(cell)
    return table


STATED = _stated()


def _versions():
    """theta_0 .. theta_VERSIONS: logits a [V] of token 0 and b [V, V] of token 1 given
    token 0; each version moves MOVE * (drift + noise) from the previous one."""
    rng = np.random.default_rng(5)
    theta = {"a": rng.normal(size=V), "b": rng.normal(size=(V, V))}
    drift = {name: rng.normal(size=x.shape) for name, x in theta.items()}
    chain = [theta]
    for _ in range(VERSIONS):
        theta = {n: x + MOVE * (drift[n] + rng.normal(size=x.shape)) for n, x in theta.items()}
        chain.append(theta)
    return chain


def _token_logprobs(theta, seqs):
    """log pi(y_t | y_<t) [..., T] of token sequences seqs [..., T] under the table theta."""
    la = jax.nn.log_softmax(theta["a"])
    lb = jax.nn.log_softmax(theta["b"], axis=-1)
    return jnp.stack([la[seqs[..., 0]], lb[seqs[..., 0], seqs[..., 1]]], axis=-1)


def _sequence_probs(theta):
    return jnp.exp(jnp.sum(_token_logprobs(theta, SEQUENCES), axis=-1))  # [V**T]


def _grad_j_k(theta, k):
    """grad of J_k(theta) = sum over k-tuples of sequences of prod_j pi(y_j) max_j r(y_j)."""
    tuples = np.array(list(itertools.product(range(len(SEQUENCES)), repeat=k)))
    best = REWARDS[tuples].max(axis=1)

    def j_k(th):
        return jnp.sum(jnp.prod(_sequence_probs(th)[tuples], axis=1) * best)

    return jax.grad(j_k)(theta)


def _expected_update(mu, theta, objective, k, step, start=None):
    """sum over N-groups y ~ mu of prod_i mu(y_i) * (-grad of loss_of_logprobs at theta),
    each group a batch of B = 1 with mu's log-probs and the on-policy advantages. start:
    the step's starting policy (old_logprobs); None: theta itself (a step's first update)."""
    tokens = SEQUENCES[GROUPS]  # [G, N, T]
    weight = jnp.prod(_sequence_probs(mu)[GROUPS], axis=1)  # P_mu(group) [G]
    scores = jnp.asarray(REWARDS[GROUPS])  # [G, N]
    sampler = _token_logprobs(mu, tokens)  # [G, N, T]
    advantages = compute_advantages(objective, k, scores)  # at sampling time, from scores
    mask = jnp.ones((1, N, T), bool)
    prompts = jnp.zeros((1, 1), jnp.int32)  # loss_of_logprobs runs no model
    reweight = offpolicy_reweighter(objective, step, (k,))

    def group_loss(th, tok, slp, sc, adv):
        logp = _token_logprobs(th, tok)[None]  # [1, N, T]
        batch = RLBatch(prompts, prompts == 0, tok[None], mask, slp[None], sc[None], adv[None])
        loss, _ = loss_of_logprobs(
            logp,
            batch,
            step,
            old_logprobs=jax.lax.stop_gradient(  # the step's starting policy
                logp if start is None else _token_logprobs(start, tok)[None]
            ),
            k=jnp.int32(k),
            reweight=reweight,
        )
        return loss

    def expected_loss(th):
        per_group = jax.vmap(group_loss, in_axes=(None, 0, 0, 0, 0))(
            th, tokens, sampler, scores, advantages
        )
        return jnp.sum(weight * per_group)

    return jax.tree.map(jnp.negative, jax.grad(expected_loss)(theta))


def _relative_error(got, want):
    """||got - want|| / ||want||, Euclidean over all the policy's logits."""
    g = np.concatenate([np.ravel(got[n]) for n in sorted(want)])
    w = np.concatenate([np.ravel(want[n]) for n in sorted(want)])
    return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def _lag_error(name, d, start=None, **fields):
    """(relative error of the expected update against grad J of the current policy,
    largest sequence ratio pi/mu, largest per-token ratio) at lag d."""
    objective, k = OBJECTIVES[name]
    chain = _versions()
    theta, mu = chain[-1], chain[-1 - d]
    step = StepConfig(policy_lag=d, **fields)
    got = _expected_update(mu, theta, objective, k, step, start)
    err = _relative_error(got, _grad_j_k(theta, k))
    token_ratio = jnp.exp(_token_logprobs(theta, SEQUENCES) - _token_logprobs(mu, SEQUENCES))
    seq_ratio = _sequence_probs(theta) / _sequence_probs(mu)
    return err, float(jnp.max(seq_ratio)), float(jnp.max(token_ratio))


EXACT_LOSSES = {  # rl.loss under EXACT -> StepConfig fields (PPO: decoupled, one update)
    "PG": dict(lag_correction=LagCorrection.EXACT),
    "PPO": dict(
        lag_correction=LagCorrection.EXACT, loss=PolicyLoss.PPO, ratio_level=RatioLevel.SEQUENCE
    ),
}


@pytest.mark.parametrize("loss", list(EXACT_LOSSES))
@pytest.mark.parametrize("d", [1, 2, 4])
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_exact_lag_correction_is_grad_j_of_the_current_policy(name, d, loss):
    """A step's first update (the start is the current policy): PG's rho_i, and decoupled
    PPO's pi_start / mu times its unclipped ratio 1, give grad J of the current policy."""
    with jax.enable_x64(True):
        err, max_ratio, _ = _lag_error(name, d, **EXACT_LOSSES[loss])
    print(f"{name} d={d} EXACT {loss}: max sequence ratio {max_ratio:.2f}, error {err:.1e}")
    assert max_ratio > 1.3  # mu really differs from the current policy
    assert err < 1e-9


@pytest.mark.parametrize("name", ["MEAN", "MAX2-L2O"])
def test_decoupled_ppo_later_update_is_exact_where_the_clip_does_not_bind(name):
    """A later update of a step: the start is theta_3, the current policy theta_4, mu =
    theta_2 (d = 2). With epsilon 0.9 no ratio pi/pi_start leaves [0.1, 1.9], so the
    weight (pi_start / mu) (pi / pi_start) = pi / mu is exact; at epsilon 0.02 the clip
    binds and the update is PPO's trust-region step, not grad J (checked: error > 1%)."""
    chain = _versions()
    start = chain[-2]
    with jax.enable_x64(True):
        ratio = _sequence_probs(chain[-1]) / _sequence_probs(start)
        assert 0.1 < float(ratio.min()) and float(ratio.max()) < 1.9 and float(ratio.max()) > 1.05
        wide = dict(EXACT_LOSSES["PPO"], ppo_epsilon=0.9, epochs=2)
        err, _, _ = _lag_error(name, 2, start=start, **wide)
        narrow = dict(EXACT_LOSSES["PPO"], ppo_epsilon=0.02, epochs=2)
        clipped, _, _ = _lag_error(name, 2, start=start, **narrow)
    print(f"{name}: later update error {err:.1e} (epsilon 0.9), {clipped:.3f} (epsilon 0.02)")
    assert err < 1e-9
    assert clipped > 1e-2


BIASED = [(name, d, c) for name in OBJECTIVES for d in (1, 2) for c in CORRECTIONS]


@pytest.mark.parametrize("name, d, correction", BIASED, ids=["-".join(map(str, c)) for c in BIASED])
def test_stated_bias_of_tis_and_none(name, d, correction):
    """Each measured error is the docstring's stated one (within TOLERANCE), and clearly
    nonzero; "exact" entries are < 1e-9."""
    stated = STATED[name, d, correction]
    with jax.enable_x64(True):
        err, _, max_token_ratio = _lag_error(name, d, **CORRECTIONS[correction])
    print(f"{name} d={d} {correction}: relative error {err:.3g} (stated {stated})")
    if correction == "TIS":
        assert max_token_ratio > TIS_CAP  # the truncation binds for some tokens
    if stated is None:
        assert err < 1e-9
        return
    assert err > 1e-2
    assert abs(err - stated) <= TOLERANCE * stated


def test_the_table_covers_every_case():
    assert set(STATED) == set(BIASED)
