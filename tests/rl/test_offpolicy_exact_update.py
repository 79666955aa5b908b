"""The exact off-policy max@k update is exact for completions longer than one token.

A two-token policy over a 3-token vocabulary (9 sequences, continuous rewards) has moved
away from the policy that sampled. Enumerating every group of N samples from the old
policy, the expected gradient of the trainer's loss (kjax.rl.objective's reweighter for
the advantages, losses.ppo_clip_loss with one sequence ratio per sample) must equal the
gradient of J_k = E[max of k samples] under the NEW policy, computed here from its
definition by enumerating k-tuples: no ratio, advantage or loss code is shared with the
trainer. The per-token ratio, the same advantages in the per-token surrogate, is shown
to miss it (what RatioLevel.SEQUENCE fixes).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.objectives import MaxAtKEstimator
from kjax.rl import losses
from kjax.rl.config import (
    Objective,
    ObjectiveConfig,
    OffPolicyMaxAtK,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.rl.objective import offpolicy_reweighter

V, T, K = 3, 2, 2
EPSILON = 0.95  # clip range [0.05, 1.95]: wide enough that no sample of this test clips


def _policy(seed: int, move: float):
    """(old, new) tables of a two-token autoregressive policy: logits a [V] of token 0 and
    b [V, V] of token 1 given token 0; new = old + move * noise."""
    rng = np.random.default_rng(seed)
    old = {"a": rng.normal(size=V), "b": rng.normal(size=(V, V))}
    new = {name: x + move * rng.normal(size=x.shape) for name, x in old.items()}
    return old, new


SEQUENCES = np.array(list(itertools.product(range(V), repeat=T)))  # [V**T, T]


def _token_logprobs(theta, seqs):
    """log pi(y_t | y_<t) [..., T] of token sequences seqs [..., T] under the table theta."""
    la = jax.nn.log_softmax(theta["a"])
    lb = jax.nn.log_softmax(theta["b"], axis=-1)
    return jnp.stack([la[seqs[..., 0]], lb[seqs[..., 0], seqs[..., 1]]], axis=-1)


def _sequence_probs(theta):
    return jnp.exp(jnp.sum(_token_logprobs(theta, SEQUENCES), axis=-1))  # [V**T]


def _grad_j_k(theta, rewards, k):
    """grad of J_k(theta) = sum over k-tuples of sequences of prod_j pi(y_j) max_j r(y_j)."""
    tuples = np.array(list(itertools.product(range(len(SEQUENCES)), repeat=k)))
    best = rewards[tuples].max(axis=1)

    def j_k(th):
        p = _sequence_probs(th)
        return jnp.sum(jnp.prod(p[tuples], axis=1) * best)

    return jax.grad(j_k)(theta)


def _expected_trainer_grad(old, new, rewards, n, k, estimator, ratio_level):
    """sum over N-groups y ~ pi_old of P_old(group) * (-grad of the trainer's loss at new),
    and the largest sequence ratio pi_new / pi_old over the groups."""
    groups = np.array(list(itertools.product(range(len(SEQUENCES)), repeat=n)))  # [G, N]
    tokens = SEQUENCES[groups]  # [G, N, T]
    weight = jnp.prod(_sequence_probs(old)[groups], axis=1)  # P_old(group) [G]
    scores = jnp.asarray(rewards[groups])  # [G, N]
    mask = jnp.ones(tokens.shape, bool)
    old_lp = _token_logprobs(old, tokens)
    objective = ObjectiveConfig(Objective.MAX_AT_K, k=k, max_at_k_estimator=estimator)
    step = StepConfig(
        loss=PolicyLoss.PPO,
        epochs=2,
        ppo_epsilon=EPSILON,
        ratio_level=RatioLevel.SEQUENCE,
        offpolicy_max_at_k=OffPolicyMaxAtK.EXACT,
    )
    reweight = offpolicy_reweighter(objective, step, (k,))

    def group_loss(theta, tok, olp, sc):
        logp = _token_logprobs(theta, tok)[None]  # one group: B = 1
        lr = losses.sequence_logprob(logp, mask[:1]) - losses.sequence_logprob(olp[None], mask[:1])
        adv = reweight(sc[None], jax.lax.stop_gradient(lr), jnp.int32(k))
        loss, metrics = losses.ppo_clip_loss(
            logp, olp[None], adv, mask[:1], epsilon=EPSILON, ratio_level=ratio_level
        )
        return loss, metrics["clip_fraction"]

    def expected_loss(theta):
        per_group, clipped = jax.vmap(group_loss, in_axes=(None, 0, 0, 0))(
            theta, tokens, old_lp, scores
        )
        return jnp.sum(weight * per_group), jnp.max(clipped)

    grad, clipped = jax.grad(expected_loss, has_aux=True)(new)
    assert float(clipped) == 0.0  # the exact regime: no sample clipped
    ratios = _sequence_probs(new) / _sequence_probs(old)
    return jax.tree.map(jnp.negative, grad), float(jnp.max(ratios))


def _relative_error(got, want):
    g = np.concatenate([np.ravel(got[n]) for n in sorted(want)])
    w = np.concatenate([np.ravel(want[n]) for n in sorted(want)])
    return float(np.max(np.abs(g - w)) / np.max(np.abs(w)))


CASES = [  # (N, estimator)
    (3, MaxAtKEstimator.S),
    (3, MaxAtKEstimator.LOO_MINUS_ONE),
    (3, MaxAtKEstimator.L2O),
    (4, MaxAtKEstimator.LOO_MINUS_ONE),
]


@pytest.mark.parametrize("n, estimator", CASES, ids=[f"N{n}-{e.name}" for n, e in CASES])
def test_sequence_ratio_update_is_grad_j_k(n, estimator):
    with jax.enable_x64(True):
        old, new = _policy(seed=3, move=0.45)
        rewards = np.random.default_rng(7).uniform(size=len(SEQUENCES))  # continuous, distinct
        want = _grad_j_k(new, rewards, K)
        got, max_ratio = _expected_trainer_grad(
            old, new, rewards, n, K, estimator, RatioLevel.SEQUENCE
        )
        err = _relative_error(got, want)
    print(f"N={n} {estimator.name}: max sequence ratio {max_ratio:.2f}, relative error {err:.1e}")
    assert max_ratio > 1.3  # the policy has really moved: a ratio-free update would be off
    assert err < 1e-9


def test_token_ratio_update_misses_grad_j_k():
    """The same advantages with PPO's per-token ratio: sum_t rho_t A' grad log pi(y_t)
    is not rho A' grad log pi(y) once T > 1 and the policy has moved."""
    with jax.enable_x64(True):
        old, new = _policy(seed=3, move=0.45)
        rewards = np.random.default_rng(7).uniform(size=len(SEQUENCES))
        want = _grad_j_k(new, rewards, K)
        got, _ = _expected_trainer_grad(
            old, new, rewards, 3, K, MaxAtKEstimator.LOO_MINUS_ONE, RatioLevel.TOKEN
        )
        err = _relative_error(got, want)
    print(f"per-token ratio: relative error {err:.1e}")
    assert err > 1e-2


def test_exact_and_linear_refuse_the_token_ratio():
    for mode in (OffPolicyMaxAtK.EXACT, OffPolicyMaxAtK.LINEAR):
        with pytest.raises(ValueError, match="rl.ratio_level=SEQUENCE"):
            StepConfig(loss=PolicyLoss.PPO, epochs=2, offpolicy_max_at_k=mode)
    with pytest.raises(ValueError, match="rl.loss=PPO"):
        StepConfig(ratio_level=RatioLevel.SEQUENCE)
