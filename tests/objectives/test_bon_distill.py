"""Best-of-n distillation (kjax/objectives/bon_distill.py) by exact enumeration in float64.

On a 5-armed softmax bandit every outcome is enumerated: the best-of-n distribution (all
n-tuples of draws), the maximiser of E_pi[g] - KL(pi || pi_ref), and the expectation of
sum_i A_i grad log pi(y_i) over all N-sample groups. Nothing is sampled.

What is exact and what is not (docs/estimators.md section 8):
- the maximiser of E_pi[R] - KL(pi || pi_ref) with R = log(w_n / n) (the library's reward)
  is the best-of-n distribution exactly, ties or not;
- the issue's continuous form pi_ref n F^(n-1) (the optimum of E_pi[(n - 1) log F]
  - KL) is not even a distribution on a finite output set: it is exact only in the
  continuum limit, and the tests show the gap closing as the arms get finer;
- with fixed anchors the estimator is exactly unbiased for grad E_pi[R];
- with the group's own samples as anchors it is exactly unbiased for the frozen-anchor
  objective E_pi[g_{N-1}(r)], whose gap to (n - 1) log F is -(n - 1)(1 - F) / (2 M F)
  to first order in 1 / M.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.objectives import bon_distill as bd
from kjax.objectives import mean_advantages
from kjax.objectives.advantages import MeanBaseline
from kjax.rl.objective import (
    KSchedule,
    KScheduleKind,
    Objective,
    ObjectiveConfig,
    compute_advantages,
    objective_ks,
    objective_value,
)
from tests.objectives.helpers import all_outcomes, expected_score_gradient

THETA = np.array([0.5, -0.4, 0.2, 0.9, -0.1])  # pi_ref = softmax(THETA)
DISTINCT = np.array([0.1, 0.7, 0.35, 0.9, 0.55])  # continuous rewards, no two alike
TIES = np.array([0.1, 0.7, 0.35, 0.7, 0.1])  # arms 1 and 3 tie, and arms 0 and 4
REWARDS = {"distinct": DISTINCT, "ties": TIES}


def softmax(theta):
    e = np.exp(theta - theta.max())
    return e / e.sum()


def cdfs(p, values):
    """F(r(y)) = P(R <= r(y)) and F_(r(y)) = P(R < r(y)) under p, per arm."""
    below_or_at = values[None, :] <= values[:, None]
    below = values[None, :] < values[:, None]
    return below_or_at @ p, below @ p


def best_of_n_enumerated(p, values, n):
    """P(best of n draws from p is arm y), ties among the best split uniformly."""
    out = np.zeros_like(p)
    for draw in itertools.product(range(len(p)), repeat=n):
        prob = np.prod(p[list(draw)])
        best = max(values[a] for a in draw)
        winners = [a for a in draw if values[a] == best]
        for a in winners:
            out[a] += prob / len(winners)
    return out


def tie_split_weight(p, values, n):
    """w_n = (F^n - F_^n) / (F - F_), so that pi_bon = p * w_n."""
    f, f_below = cdfs(p, values)
    return (f**n - f_below**n) / (f - f_below)


def gibbs(p, g):
    """argmax_pi E_pi[g] - KL(pi || p) = p exp(g) / Z, and log Z."""
    u = p * np.exp(g - g.max())
    return u / u.sum(), math.log(u.sum()) + g.max()


def regularised_value(pi, p, g):
    return float(pi @ g - pi @ np.log(pi / p))


def tv(a, b):
    return 0.5 * float(np.abs(a - b).sum())


# ---------------------------------------------------------------- (i) the optimum
#
# The first three tests are derivation checks: they check the module docstring's math on
# test-local helpers and call no kjax code. test_library_weight_is_the_tie_split_weight and
# test_library_reward_tilts_the_anchor_distribution_to_its_best_of_n compare the library
# with what they derive.


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("kind", ["distinct", "ties"])
def test_best_of_n_is_the_tie_split_form(n, kind):
    """Derivation check (no kjax code): enumerated best-of-n = pi_ref w_n."""
    values, p = REWARDS[kind], softmax(THETA)
    enumerated = best_of_n_enumerated(p, values, n)
    np.testing.assert_allclose(enumerated, p * tie_split_weight(p, values, n), rtol=1e-12)
    np.testing.assert_allclose(enumerated.sum(), 1.0, rtol=1e-12)
    if kind == "distinct":  # F - F_ = pi_ref(y): pi_bon(y) = F^n - F_^n
        f, f_below = cdfs(p, values)
        np.testing.assert_allclose(enumerated, f**n - f_below**n, rtol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("kind", ["distinct", "ties"])
def test_the_objective_with_the_exact_weight_is_maximised_by_best_of_n(n, kind):
    """Derivation check (no kjax code): max_pi E_pi[log(w_n / n)] - KL(pi || pi_ref) =
    -log n, attained at pi_bon only."""
    values, p = REWARDS[kind], softmax(THETA)
    g = np.log(tie_split_weight(p, values, n) / n)
    optimum, log_z = gibbs(p, g)
    np.testing.assert_allclose(optimum, best_of_n_enumerated(p, values, n), rtol=1e-12)
    np.testing.assert_allclose(log_z, -math.log(n), rtol=1e-12)
    # The Gibbs identity: value(pi) = log Z - KL(pi || optimum), so nothing beats it.
    rng = np.random.default_rng(n)
    for pi in rng.dirichlet(np.ones(len(p)), size=200):
        value = regularised_value(pi, p, g)
        kl = float(pi @ np.log(pi / optimum))
        np.testing.assert_allclose(value, log_z - kl, rtol=1e-10, atol=1e-12)
        assert value < log_z
    # Stationary in the logits, by autodiff of the objective itself.
    with jax.enable_x64(True):

        def objective(logits):
            pi = jax.nn.softmax(logits)
            return pi @ g - pi @ (jnp.log(pi) - jnp.log(p))

        grad = jax.grad(objective)(jnp.log(jnp.asarray(optimum)))
        np.testing.assert_allclose(grad, 0.0, atol=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_the_continuous_form_is_exact_only_in_the_continuum_limit(n):
    """Derivation check (no kjax code; the library's R for rewards that tie no anchor is
    (n - 1) log F_hat, test_fixed_anchor_estimator_is_unbiased):
    pi_ref n F^(n-1) sums to more than 1 on finitely many outputs, and the maximiser of
    E_pi[(n - 1) log F] - KL (pi ∝ pi_ref F^(n-1)) is not best-of-n; the gap closes as
    the outputs get finer (here: K equally likely arms with distinct rewards)."""
    p = softmax(THETA)
    f, _ = cdfs(p, DISTINCT)
    assert (p * n * f ** (n - 1)).sum() > 1.0 + 1e-3
    optimum, _ = gibbs(p, (n - 1) * np.log(f))
    assert tv(optimum, p * tie_split_weight(p, DISTINCT, n)) > 1e-3
    gaps = []
    rng = np.random.default_rng(0)
    for arms in (5, 50, 500):
        p, values = np.full(arms, 1.0 / arms), rng.permutation(arms).astype(np.float64)
        f, _ = cdfs(p, values)
        optimum, _ = gibbs(p, (n - 1) * np.log(f))
        gaps.append(tv(optimum, p * tie_split_weight(p, values, n)))
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3, gaps


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("kind", ["distinct", "ties"])
def test_library_weight_is_the_tie_split_weight(n, kind):
    """The library's R against anchors whose empirical distribution is pi_ref (rational)
    is log(w_n / n) with w_n the tie-split weight, i.e. log(pi_bon / (n pi_ref)) with
    pi_bon enumerated: what the derivation checks above stand for."""
    values = REWARDS[kind]
    counts = np.array([3, 1, 4, 2, 5])
    p = counts / counts.sum()
    anchors = np.repeat(values, counts)[None, :]
    with jax.enable_x64(True):
        r = np.asarray(bd.bon_log_cdf_rewards(values[None, :], anchors, n, floor=1e-9))[0]
    np.testing.assert_allclose(r, np.log(tie_split_weight(p, values, n) / n), rtol=1e-12)
    np.testing.assert_allclose(np.exp(r) * n * p, best_of_n_enumerated(p, values, n), rtol=1e-10)
    assert np.all(np.diff(r[np.argsort(values)]) >= 0)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("kind", ["distinct", "ties"])
def test_library_reward_tilts_the_anchor_distribution_to_its_best_of_n(n, kind):
    """With anchors whose empirical distribution is pi_ref exactly (rational pi_ref), the
    library's R gives pi_ref exp(R) = pi_bon / n: the optimum is best-of-n, Z = 1/n."""
    values = REWARDS[kind]
    counts = np.array([3, 1, 4, 2, 5])
    p = counts / counts.sum()
    anchors = np.repeat(values, counts)[None, :]
    with jax.enable_x64(True):
        r = np.asarray(bd.bon_log_cdf_rewards(values[None, :], anchors, n, floor=1e-9))[0]
    optimum, log_z = gibbs(p, r)
    np.testing.assert_allclose(optimum, best_of_n_enumerated(p, values, n), rtol=1e-10)
    np.testing.assert_allclose(log_z, -math.log(n), rtol=1e-10)


# ------------------------------------------------- (ii) the score-function estimator


ANCHORS = {
    # No anchor equals an arm's reward: R = (n - 1) log F_hat exactly (floored).
    "off_grid": np.array([0.05, 0.2, 0.3, 0.6, 0.62, 0.8, 0.95]),
    # Anchors on the arms' rewards: the tie factor is in play.
    "on_grid": np.array([0.1, 0.35, 0.35, 0.7, 0.9, 0.9, 0.55]),
}


def expected_gradient(n_samples, advantages_fn):
    outcomes = all_outcomes(len(THETA), n_samples)
    adv = advantages_fn(jnp.asarray(DISTINCT)[outcomes])
    return expected_score_gradient(jnp.asarray(THETA), outcomes, adv)


@pytest.mark.parametrize("anchors", sorted(ANCHORS))
@pytest.mark.parametrize(("n_samples", "n"), [(2, 2), (3, 4), (4, 3), (4, 8)])
def test_fixed_anchor_estimator_is_unbiased(anchors, n_samples, n):
    a = ANCHORS[anchors]
    floor = 0.05
    with jax.enable_x64(True):
        r = np.asarray(bd.bon_log_cdf_rewards(DISTINCT[None, :], a[None, :], n, floor))[0]
        if anchors == "off_grid":
            f_hat = (a[None, :] <= DISTINCT[:, None]).mean(-1)
            np.testing.assert_allclose(r, (n - 1) * np.log(np.maximum(f_hat, floor)), rtol=1e-12)

        def advantages(rewards):
            tiled = jnp.broadcast_to(jnp.asarray(a), (rewards.shape[0], len(a)))
            return bd.bon_distill_advantages(rewards, n, anchor_rewards=tiled, floor=floor)

        got = expected_gradient(n_samples, advantages)
        want = jax.grad(lambda t: jax.nn.softmax(t) @ jnp.asarray(r))(jnp.asarray(THETA))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        assert np.abs(want).max() > 1e-2  # the check has teeth


def frozen_anchor_reward(n_samples, n, floor):
    """g(y) = E[R(r(y); N - 1 anchors drawn from pi_ref)], the anchors enumerated."""
    p, m = softmax(THETA), n_samples - 1
    draws = all_outcomes(len(THETA), m)
    probs = np.prod(p[draws], axis=-1)
    g = []
    for value in DISTINCT:
        rewards = np.full((len(draws), 1), value)
        r = np.asarray(bd.bon_log_cdf_rewards(rewards, DISTINCT[draws], n, floor))[:, 0]
        g.append(probs @ r)
    return np.array(g)


@pytest.mark.parametrize(("n_samples", "n"), [(3, 2), (3, 4), (4, 3), (4, 8)])
def test_leave_one_out_estimator_is_unbiased_for_the_frozen_moving_anchor(n_samples, n):
    """E[sum_i A_i grad log pi(y_i)] = grad_theta E_{pi_theta}[g(r)], g's anchors drawn from
    the sampling policy and held fixed (the semi-gradient); the leave-two-out baseline is
    what keeps it exact: RLOO on the same rewards is biased."""
    floor = 0.5 / (n_samples - 1)  # the leave-one-out default
    with jax.enable_x64(True):
        g = frozen_anchor_reward(n_samples, n, floor)
        want = jax.grad(lambda t: jax.nn.softmax(t) @ jnp.asarray(g))(jnp.asarray(THETA))
        got = expected_gradient(n_samples, lambda r: bd.bon_distill_advantages(r, n))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        assert np.abs(want).max() > 1e-2

        def rloo(rewards):
            r = bd.bon_log_cdf_rewards_loo(rewards, n)
            return mean_advantages(r, MeanBaseline.RLOO) / rewards.shape[1]

        biased = expected_gradient(n_samples, rloo)
        assert np.abs(biased - want).max() > 1e-3


def test_leave_one_out_reward_is_the_fixed_anchor_reward_of_the_others():
    rng = np.random.default_rng(4)
    rewards = np.concatenate([rng.choice([0.0, 0.5, 1.0], (3, 7)), rng.uniform(size=(3, 7))])
    with jax.enable_x64(True):
        loo = np.asarray(bd.bon_log_cdf_rewards_loo(rewards, 5, floor=0.01))
        for i in range(7):
            others = np.delete(rewards, i, axis=1)
            fixed = bd.bon_log_cdf_rewards(rewards[:, i : i + 1], others, 5, floor=0.01)
            np.testing.assert_allclose(loo[:, i], np.asarray(fixed)[:, 0], rtol=1e-12)


@pytest.mark.parametrize("f", [0.3, 0.5, 0.8])
def test_finite_anchor_bias_is_first_order_in_one_over_m(f):
    """E[(n - 1) log F_hat] - (n - 1) log F with F_hat = Binomial(M, F) / M (a reward that
    ties no anchor): M times the gap tends to -(n - 1)(1 - F) / (2 F)."""
    n = 4
    want = -(n - 1) * (1 - f) / (2 * f)
    scaled = []
    for m in (50, 400):
        x = np.arange(m + 1)
        log_pmf = np.array(
            [math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1) for j in x]
        ) + (x * math.log(f) + (m - x) * math.log(1 - f))
        anchors = np.where(np.arange(m)[None, :] < x[:, None], 0.0, 1.0)  # x anchors below
        with jax.enable_x64(True):
            r = np.asarray(bd.bon_log_cdf_rewards(np.full((m + 1, 1), 0.5), anchors, n))[:, 0]
        scaled.append(m * (np.exp(log_pmf) @ r - (n - 1) * math.log(f)))
    assert abs(scaled[1] - want) < abs(scaled[0] - want)
    np.testing.assert_allclose(scaled[1], want, rtol=0.02)


@pytest.mark.parametrize("n", [2, 4])
def test_moving_anchor_with_kl_coefficient_beta_targets_best_of_m(n):
    """Derivation check (no kjax code; exact CDFs, not the trainer's): with the group as
    the anchor and the trainer's KL to the warm start p at beta, a stationary policy
    satisfies pi = p exp(R_pi / beta) / Z. Best-of-m of p solves it in the continuum limit
    with m = beta / (beta - (n - 1)): beta = n gives best-of-n. What the trainer's own
    reward (N - 1 anchors, the floor) makes stationary is the next test's."""
    arms = 1000
    p = np.full(arms, 1.0 / arms)
    values = np.random.default_rng(1).permutation(arms).astype(np.float64)

    def update(pi, beta):
        return gibbs(p, np.log(tie_split_weight(pi, values, n) / n) / beta)[0]

    for beta, m in [(n, n), (2.0 * (n - 1), 2)]:
        target = p * tie_split_weight(p, values, m)
        assert tv(update(target, beta), target) < 1e-3, (beta, m)
    bon = p * tie_split_weight(p, values, n)
    assert tv(update(bon, 1.0), bon) > 0.1  # vBoN's fixed-anchor weight is not it


def stationary_of_the_trainer(p0, values, n, big_n, beta, floor=None):
    """The stationary point of the trainer's expected BON_DISTILL update with the KL to the
    warm start p0 at beta, by exact enumeration: pi = p0 exp(g_M[pi] / beta) / Z, where
    g_M[pi](y) is the library's leave-one-out reward of y averaged over its M = N - 1
    anchors drawn from pi (every multinomial count of anchors below, tied with and above
    y; rewards distinct), the objective the estimator is exactly unbiased for
    (test_leave_one_out_estimator_is_unbiased_for_the_frozen_moving_anchor). Damped
    fixed-point iteration from p0."""
    from scipy.special import gammaln, xlogy

    m = big_n - 1  # floor None: the library's default (0.5 / m)
    below, tied = np.array([(j, e) for j in range(m + 1) for e in range(m + 1 - j)]).T
    slot = np.arange(m)[None, :]
    anchors = np.where(
        slot < below[:, None], -1.0, np.where(slot < (below + tied)[:, None], 0.0, 1.0)
    )
    with jax.enable_x64(True):  # R of a reward 0 against each count (the library's)
        r = np.asarray(bd.bon_log_cdf_rewards(np.zeros((len(below), 1)), anchors, n, floor))[:, 0]
    log_multinomial = (
        gammaln(m + 1) - gammaln(below + 1) - gammaln(tied + 1) - gammaln(m - below - tied + 1)
    )
    order = np.argsort(values)
    pi = p0.copy()
    for _ in range(5000):
        cdf_below = np.empty_like(pi)
        cdf_below[order] = np.concatenate([[0.0], np.cumsum(pi[order])[:-1]])
        above = np.maximum(1.0 - cdf_below - pi, 0.0)
        log_prob = (log_multinomial + xlogy(below, cdf_below[:, None]) + xlogy(tied, pi[:, None])
                    + xlogy(m - below - tied, above[:, None]))  # fmt: skip
        g = np.exp(log_prob) @ r
        new = gibbs(p0, g / beta)[0]
        if np.abs(new - pi).max() < 1e-14:
            return new
        pi = 0.5 * (pi + new)
    raise AssertionError("no fixed point in 5000 iterations")


def best_of_m(p0, values, m):
    """Best-of-m of p0 for real m >= 1 (distinct rewards): F^m - F_^m."""
    order = np.argsort(values)
    f = np.empty_like(p0)
    f[order] = np.cumsum(p0[order])
    return f**m - (f - p0) ** m


def test_the_trainers_stationary_point_at_the_shipped_preset_is_not_best_of_n():
    """tiny_countdown_bon's preset (n = 8, N = 16, rl.kl_coef = 8, the default floor) on 64
    equally likely outputs with distinct rewards (i + 0.5) / 64: the expected update is
    stationary at a policy nearest best-of-3.3 of the warm start, mean reward 0.735 against
    best-of-8's 0.889, the numbers docs/estimators.md section 8 and the docstrings state;
    a best-of-n stationary point needs exact CDFs (the derivation check above)."""
    from experiments.configs import tiny_countdown_bon

    cfg = tiny_countdown_bon.get_config()
    n, big_n, beta = cfg.objective.k, cfg.samples, cfg.rl.kl_coef
    assert (n, big_n, beta) == (8, 16, 8.0)
    arms = 64
    p0, values = np.full(arms, 1.0 / arms), (np.arange(arms) + 0.5) / arms
    pi = stationary_of_the_trainer(p0, values, n, big_n, beta)
    ms = np.linspace(1.0, 10.0, 901)
    distance = [tv(pi, best_of_m(p0, values, m)) for m in ms]
    nearest = ms[int(np.argmin(distance))]
    assert nearest == pytest.approx(3.3, abs=0.05) and min(distance) == pytest.approx(
        0.066, abs=0.002
    )
    assert pi @ values == pytest.approx(0.735, abs=0.001)
    assert best_of_m(p0, values, n) @ values == pytest.approx(0.889, abs=0.001)


def test_binary_rewards_miss_best_of_n_even_with_exact_cdfs():
    """Derivation check (the module docstring's binary closed form, no kjax code): with
    exact CDFs, n = beta = 8, a warm start that succeeds with probability 0.3 is stationary
    where logit(s) = logit(0.3) + (R_correct(s) - R_wrong(s)) / beta: at s = 0.441, not at
    pass@8 = 0.942. The library's binary rewards are those closed forms
    (test_binary_rewards_give_the_pass_at_n_weights)."""
    from scipy.optimize import brentq

    n, beta, s0 = 8, 8.0, 0.3

    def gap(s):
        correct, wrong = math.log((1 - (1 - s) ** n) / (n * s)), math.log((1 - s) ** (n - 1) / n)
        logit = math.log(s / (1 - s)) - math.log(s0 / (1 - s0))
        return logit - (correct - wrong) / beta

    s = brentq(gap, 1e-9, 1 - 1e-9)
    assert s == pytest.approx(0.441, abs=0.001) and 1 - (1 - s0) ** n == pytest.approx(
        0.942, abs=0.001
    )


# ------------------------------------------------ (iii) ties, floors and bad input


def test_all_equal_groups_get_exactly_zero():
    rewards = jnp.full((2, 6), 0.1, jnp.float32)
    anchors = jnp.asarray([[0.0, 0.1, 0.3], [0.1, 0.1, 0.1]], jnp.float32)
    for adv in (
        bd.bon_distill_advantages(rewards, 8),
        bd.bon_distill_advantages(rewards, 8, anchor_rewards=anchors),
    ):
        assert adv.dtype == jnp.float32
        np.testing.assert_array_equal(adv, 0.0)


@pytest.mark.parametrize("n", [2, 5, 16])
def test_binary_rewards_give_the_pass_at_n_weights(n):
    """Anchors with success rate p = 1 - q: log((1 - q^n) / (n p)) and log(q^(n-1) / n)."""
    anchors = np.array([[1.0, 1.0, 0.0, 0.0, 0.0]])
    p, q = 0.4, 0.6
    with jax.enable_x64(True):
        r = np.asarray(bd.bon_log_cdf_rewards(np.array([[1.0, 0.0]]), anchors, n))[0]
    np.testing.assert_allclose(r[0], math.log((1 - q**n) / (n * p)), rtol=1e-12)
    np.testing.assert_allclose(r[1], math.log(q ** (n - 1) / n), rtol=1e-12)


def test_floor_monotonicity_and_range():
    rng = np.random.default_rng(2)
    anchors = rng.uniform(size=(4, 9))
    rewards = rng.uniform(-0.5, 1.5, size=(4, 30))
    rewards[:, :3] = -1.0  # below every anchor
    rewards[:, 3:6] = anchors.min(-1, keepdims=True)  # tied with the lowest anchor
    rewards[:, 6:9] = anchors[:, 4:5]  # tied with another anchor
    rewards = np.sort(rewards, axis=1)
    n, floor = 6, 0.02
    with jax.enable_x64(True):
        r = np.asarray(bd.bon_log_cdf_rewards(rewards, anchors, n, floor))
        default = np.asarray(bd.bon_log_cdf_rewards(rewards, anchors, n))
    np.testing.assert_array_equal(r[:, :3], (n - 1) * math.log(floor))
    np.testing.assert_array_equal(default[:, :3], (n - 1) * math.log(0.5 / 9))
    assert np.all(np.diff(r, axis=1) >= 0) and np.all(np.diff(default, axis=1) >= 0)
    assert np.all(r <= 0) and np.all(r >= (n - 1) * math.log(floor))
    assert np.all(np.isfinite(r))
    top = rewards > anchors.max(-1, keepdims=True)
    np.testing.assert_array_equal(r[top], 0.0)  # above every anchor: F = 1, R = 0


def test_jit_and_float32_agree_with_float64():
    rng = np.random.default_rng(5)
    rewards = np.concatenate([rng.choice([0.0, 0.5, 1.0], (4, 12)), rng.uniform(size=(4, 12))])
    with jax.enable_x64(True):
        want = np.asarray(bd.bon_distill_advantages(rewards, 8))
    fn = jax.jit(bd.bon_distill_advantages, static_argnums=1)
    got = fn(jnp.asarray(rewards, jnp.float32), 8)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_bad_input_raises_naming_the_argument():
    r = jnp.zeros((2, 4))
    a = jnp.zeros((2, 3))
    cases = [
        (lambda: bd.bon_log_cdf_rewards(r, a, 1), "Best-of-1 is the anchor policy"),
        (lambda: bd.bon_log_cdf_rewards(r, a, 0), "`n`"),
        (lambda: bd.bon_log_cdf_rewards(r, a, 4.0), "static Python int"),
        (lambda: bd.bon_log_cdf_rewards(r, a, True), "static Python int"),
        (lambda: bd.bon_log_cdf_rewards(r, a, 4, floor=0.0), "`floor`"),
        (lambda: bd.bon_log_cdf_rewards(r, a, 4, floor=1.0), "`floor`"),
        (lambda: bd.bon_log_cdf_rewards(r, a, 4, floor=float("nan")), "`floor`"),
        (lambda: bd.bon_log_cdf_rewards(r, a, 4, floor="0.1"), "`floor`"),
        (lambda: bd.bon_log_cdf_rewards(r[0], a, 4), r"`rewards` must have shape \[B, N\]"),
        (lambda: bd.bon_log_cdf_rewards(r, a[0], 4), "`anchor_rewards` must have shape"),
        (lambda: bd.bon_log_cdf_rewards(r, a[:1], 4), "B=2 prompts"),
        (lambda: bd.bon_log_cdf_rewards(r.astype(jnp.int32), a, 4), "float dtype"),
        (lambda: bd.bon_log_cdf_rewards_loo(r[:, :1], 4), "N >= 2"),
        (lambda: bd.bon_distill_advantages(r[:, :2], 4), "N >= 3"),
        (lambda: bd.bon_distill_advantages(r[:, :1], 4, anchor_rewards=a), "N >= 2"),
        (lambda: bd.bon_distill_advantages(r, 1), "Best-of-1 is the anchor policy"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


# ------------------------------------------------------------ (iv) the trainer route


def test_router_returns_the_library_advantages():
    rng = np.random.default_rng(6)
    scores = jnp.asarray(rng.choice([0.0, 0.25, 0.5, 1.0], (5, 16)), jnp.float32)
    cfg = ObjectiveConfig(Objective.BON_DISTILL, k=8)
    want = bd.bon_distill_advantages(scores, 8)
    route = jax.jit(compute_advantages, static_argnums=(0, 1))
    for got in (compute_advantages(cfg, None, scores), route(cfg, 8, scores)):
        assert got.shape == (5, 16)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        compute_advantages(cfg, 3, scores), bd.bon_distill_advantages(scores, 3), atol=1e-7
    )
    assert objective_ks(cfg) == (1,)
    np.testing.assert_allclose(objective_value(cfg, None, scores), float(scores.mean()))


def test_config_checks_for_bon_distill():
    assert ObjectiveConfig("bon_distill", k=8).objective is Objective.BON_DISTILL
    with pytest.raises(ValueError, match=r"`ObjectiveConfig.k`=1 .* k >= 2"):
        ObjectiveConfig(Objective.BON_DISTILL)
    cfg = ObjectiveConfig(Objective.BON_DISTILL, k=8)
    cfg.check_samples(3)  # k > N is fine: best-of-k is a target, not a subset size
    with pytest.raises(ValueError, match="N >= 3"):
        cfg.check_samples(2)
    anneal = KSchedule(KScheduleKind.STEP, k_start=8, k_end=1, steps=10)
    with pytest.raises(ValueError, match="KSchedule.*k >= 2"):
        cfg.check_samples(8, anneal)
    cfg.check_samples(8, KSchedule(KScheduleKind.LINEAR, k_start=2, k_end=16, steps=10))
    with pytest.raises(ValueError, match="only read by"):
        ObjectiveConfig(Objective.BON_DISTILL, k=8, maxrl_t=2)
