"""Off-policy max@k advantages A'_i (docs/estimators.md section 4): oracle, on-policy limit,
exact unbiasedness under a behaviour policy, linearisation order, clamping, numerics.

A'_i is the weight of sample i's own ratio: the gradient estimate is
sum_i rho_i A'_i grad log pi_theta(y_i) with y ~ pi_old.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax import objectives as obj
from kjax.objectives.reference_offpolicy import max_at_k_offpolicy_advantages_ref as oracle
from tests.objectives.helpers import all_outcomes, expected_max_of_k, rewards_with_ties

E = obj.MaxAtKEstimator
OFF = (E.S, E.LOO_MINUS_ONE, E.L2O)
RTOL, ATOL = 1e-9, 1e-12
off = obj.max_at_k_offpolicy_advantages


def valid(estimator, n, k):
    return n >= estimator.min_samples(k)


# Every test on small groups uses B = 6 rows and these N, so eager calls share compiled
# ops (the file stays fast); each N is run with every valid k.
B = 6
SMALL_N = (1, 2, 3, 5, 8)
SMALL_CASES = [(n, k) for n in SMALL_N for k in range(1, n + 1)]


def small_group(n, k, seed=0, sd=0.8):
    """[B, n] rewards with ties (half the rows on a 3-value grid) and log ratios."""
    rng = np.random.default_rng(1000 * seed + 10 * n + k)
    return rewards_with_ties(rng, B, n), rng.normal(0.0, sd, size=(B, n))


@pytest.mark.parametrize(("n", "k"), SMALL_CASES)
def test_exact_matches_subset_enumeration(n, k):
    rewards, log_ratio = small_group(n, k)
    for e in OFF:
        if valid(e, n, k):
            with jax.enable_x64(True):
                got = off(rewards, log_ratio, k, estimator=e)
            want = oracle(rewards, log_ratio, k, e)
            np.testing.assert_allclose(got, want, RTOL, ATOL, err_msg=e.name)


@pytest.mark.parametrize(("n", "k"), [(n, k) for n, k in SMALL_CASES if n in (3, 8)])
@pytest.mark.parametrize(
    ("exact", "clamp"), [(True, 0.3), (True, 1.5), (False, None), (False, 0.3)]
)
def test_clamped_and_linear_match_subset_enumeration(n, k, exact, clamp):
    rewards, log_ratio = small_group(n, k, seed=1)  # sd 0.8: clipping is active
    for e in OFF:
        if valid(e, n, k):
            with jax.enable_x64(True):
                got = off(rewards, log_ratio, k, estimator=e, exact=exact, clamp=clamp)
            want = oracle(rewards, log_ratio, k, e, exact, clamp)
            np.testing.assert_allclose(got, want, RTOL, ATOL, err_msg=e.name)


@pytest.mark.parametrize(("n", "k"), SMALL_CASES)
def test_zero_log_ratio_is_the_on_policy_estimator(n, k):
    rewards, _ = small_group(n, k, seed=2)
    for e in OFF:
        if valid(e, n, k):
            for exact in (True, False):
                with jax.enable_x64(True):
                    got = off(rewards, np.zeros_like(rewards), k, estimator=e, exact=exact)
                    want = obj.max_at_k_advantages(rewards, k, e)
                np.testing.assert_allclose(got, want, RTOL, ATOL, err_msg=f"{e.name} {exact}")


def test_own_ratio_does_not_enter_its_advantage():
    """A'_i multiplies rho_i; it must depend only on the other samples' ratios."""
    rewards, log_ratio = small_group(5, 3, seed=3, sd=0.5)
    moved = log_ratio.copy()
    moved[:, 2] += 1.3
    for e in OFF:
        for exact in (True, False):
            with jax.enable_x64(True):
                a = off(rewards, log_ratio, 3, estimator=e, exact=exact)
                b = off(rewards, moved, 3, estimator=e, exact=exact)
            np.testing.assert_allclose(a[:, 2], b[:, 2], RTOL, ATOL)
            assert np.max(np.abs(np.delete(a - b, 2, axis=1))) > 1e-3  # the others do move


# A softmax bandit: behaviour policy THETA_OLD, target THETA (ratios from ~0.6 to ~1.6).
THETA_OLD = np.array([0.3, -0.2, 0.1, 0.6])
THETA = THETA_OLD + np.array([0.4, -0.5, 0.2, -0.1])
VALUES = np.array([0.0, 0.4, 1.0, 0.4])  # continuous, with a tie between answers 1 and 3
CORRECT = np.array([0.0, 0.0, 1.0, 0.0])


def offpolicy_gradient(n, adv_fn, values, theta, theta_old=THETA_OLD):
    """E_{y ~ pi_old^n}[sum_i rho_i A'_i grad log pi_theta(y_i)], exactly over all A**n y."""
    outcomes = all_outcomes(len(theta), n)
    logp_new = jax.nn.log_softmax(jnp.asarray(theta))[outcomes]
    logp_old = jax.nn.log_softmax(jnp.asarray(theta_old))[outcomes]
    rho = jnp.exp(logp_new - logp_old)
    weighted = rho * adv_fn(jnp.asarray(values)[outcomes], logp_new - logp_old)  # [M, n]
    onehot = jax.nn.one_hot(outcomes, len(theta), dtype=weighted.dtype)
    # grad log softmax(theta)[a] = onehot(a) - p.
    per = jnp.einsum("mn,mna->ma", weighted, onehot) - weighted.sum(-1)[:, None] * (
        jax.nn.softmax(jnp.asarray(theta))
    )
    return jnp.einsum("m,ma->a", jnp.exp(jnp.sum(logp_old, -1)), per)


@pytest.mark.parametrize(("n", "k"), [(3, 1), (3, 2), (4, 3), (4, 4)])
def test_exact_form_is_unbiased_under_a_behaviour_policy(n, k):
    with jax.enable_x64(True):
        grad_max = jax.grad(expected_max_of_k)(jnp.asarray(THETA), VALUES, k)
        grad_pass = jax.grad(lambda t: 1.0 - (1.0 - jax.nn.softmax(t)[2]) ** k)(jnp.asarray(THETA))
        for e in OFF:
            if not valid(e, n, k):
                continue

            def adv(r, lr, e=e):
                return off(r, lr, k, estimator=e)

            got = offpolicy_gradient(n, adv, VALUES, THETA)
            np.testing.assert_allclose(got, grad_max, rtol=1e-9, atol=1e-12, err_msg=e.name)
            got = offpolicy_gradient(n, adv, CORRECT, THETA)
            np.testing.assert_allclose(got, grad_pass, rtol=1e-9, atol=1e-12, err_msg=e.name)
            if k >= 2:  # the on-policy advantages in the same surrogate are biased here
                on = offpolicy_gradient(
                    n, lambda r, lr, e=e: obj.max_at_k_advantages(r, k, e), VALUES, THETA
                )
                assert np.max(np.abs(on - grad_max)) > 1e-3


@pytest.mark.parametrize(("n", "k"), [(3, 2), (4, 3)])
def test_linear_error_is_second_order(n, k):
    """Target theta_old + eps*u: the linearised products leave an O(eps^2) error, while
    the on-policy advantages in the same PPO surrogate leave O(eps). A product of one
    ratio (k = 2) is already linear, so there the expectation must be exact."""
    u = np.array([0.5, -1.0, 0.25, 0.75])

    def errors(e, eps):
        theta = THETA_OLD + eps * u
        true = jax.grad(expected_max_of_k)(jnp.asarray(theta), VALUES, k)
        lin = offpolicy_gradient(
            n, lambda r, lr: off(r, lr, k, estimator=e, exact=False), VALUES, theta
        )
        on = offpolicy_gradient(n, lambda r, lr: obj.max_at_k_advantages(r, k, e), VALUES, theta)
        return np.linalg.norm(lin - true), np.linalg.norm(on - true)

    with jax.enable_x64(True):
        for e in OFF:
            lin1, on1 = errors(e, 0.04)
            assert 1e-4 < on1, (e.name, on1)  # the perturbation is large enough to matter
            if k == 2:  # L2O's baseline has zero mean whatever its weights
                assert lin1 < 1e-12, (e.name, lin1)
                continue
            lin2, on2 = errors(e, 0.02)
            assert lin1 / lin2 > 3.0, (e.name, lin1, lin2)  # halving eps quarters the error
            assert 1.5 < on1 / on2 < 2.5, (e.name, on1, on2)  # ignoring ratios: only halves
            assert lin1 < 0.2 * on1, e.name


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("clamp", [None, 0.2, 0.5, 0.9, 3.0])
def test_weights_are_never_negative(exact, clamp):
    """With rewards e_j (one sample scores 1), A'_i is the total weight of the subsets that
    contain i and j: any negative subset weight would show. Ratios mostly well below 1
    push the linear products 1 + sum(delta) below 0 unless they are clipped."""
    n, k = 8, 4
    rng = np.random.default_rng(3)
    one_hot = np.eye(n)[:B]  # row b: only sample b scores
    continuous = rng.uniform(0.0, 1.0, size=(B, n))  # non-negative rewards: A' >= 0 too
    for e in (E.S, E.LOO_MINUS_ONE):
        for r in (one_hot, continuous):
            log_ratio = rng.normal(-1.5, 1.0, size=(B, n))  # most deltas near -0.8
            with jax.enable_x64(True):
                a = np.asarray(off(r, log_ratio, k, estimator=e, exact=exact, clamp=clamp))
            assert a.min() >= -1e-12, (e.name, a.min())


def test_float32_agrees_with_float64_at_n64():
    """Errors relative to each row's largest |S'| (about (k/N) max|r|) or |A'|, whichever is
    larger: off-policy L2O is not shift-invariant, so its two terms can cancel to below
    S's scale on tie-heavy groups, and its error is relative to that scale."""
    n, k = 64, 8
    rng = np.random.default_rng(0)
    rewards = rewards_with_ties(rng, 4, n).astype(np.float32).astype(np.float64)
    # (0, 0.3): a PPO-like spread; (0, 3): ratios e^+-9; (10, 0.3): the sums of products
    # of 7 ratios reach 1e40, past float32's 3e38, though every A' is representable.
    for centre, sd, tol in ((0.0, 0.3, 2e-6), (0.0, 3.0, 1e-4), (10.0, 0.3, 2e-5)):
        log_ratio = rng.normal(centre, sd, size=(4, n)).astype(np.float32).astype(np.float64)
        with jax.enable_x64(True):
            scale = np.max(np.abs(off(rewards, log_ratio, k, estimator=E.S)), 1, keepdims=True)
        for e in OFF:
            for exact in (True, False) if centre == 0 and sd < 1 else (True,):
                a32 = np.asarray(off(rewards, log_ratio, k, estimator=e, exact=exact))
                assert a32.dtype == np.float32
                with jax.enable_x64(True):
                    a64 = np.asarray(off(rewards, log_ratio, k, estimator=e, exact=exact))
                assert np.all(np.isfinite(a32)), (e.name, centre, sd)
                # L2O's baseline is a product of k ratios, S's of k-1: at centre 10 it is
                # e^10 times larger than S, so take the larger of the two scales.
                row = np.maximum(scale, np.max(np.abs(a64), 1, keepdims=True))
                err = np.max(np.abs(a32 - a64) / row)
                assert err < tol, (e.name, exact, centre, sd, err)


@pytest.mark.slow
def test_large_group_on_policy_limit_in_float32():
    """N = 256, k = 32: C(N, k) ~ 1e40 is past float32's range; relative to |S'| as above."""
    n, k = 256, 32
    rewards = np.round(np.random.default_rng(1).uniform(0, 1, (2, n)), 2).astype(np.float32)
    with jax.enable_x64(True):
        scale = np.max(np.abs(obj.max_at_k_advantages(rewards.astype(np.float64), k, E.S)), 1)
    for e in OFF:
        got = np.asarray(off(rewards, np.zeros_like(rewards), k, estimator=e))
        with jax.enable_x64(True):
            want = np.asarray(obj.max_at_k_advantages(rewards.astype(np.float64), k, e))
        assert np.max(np.abs(got - want) / scale[:, None]) < 5e-6, e.name


def test_jit_and_vmap_agree_with_eager():
    rng = np.random.default_rng(2)
    rewards = jnp.asarray(rewards_with_ties(rng, 3, 16), jnp.float32)
    log_ratio = jnp.asarray(rng.normal(0.0, 0.3, (3, 16)), jnp.float32)
    cases = [(e, True) for e in OFF] + [(E.L2O, False)]

    def every_case(r, lr):
        return [off(r, lr, 3, estimator=e, exact=x, clamp=0.5) for e, x in cases]

    def l2o_per_group(r, lr):  # vmap over groups, each call sees a [1, N] batch
        return off(r[None], lr[None], 3, estimator=E.L2O, exact=True, clamp=0.5)[0]

    # One compile for all cases keeps this cheap.
    jitted, vmapped = jax.jit(lambda r, lr: (every_case(r, lr), jax.vmap(l2o_per_group)(r, lr)))(
        rewards, log_ratio
    )
    eager = every_case(rewards, log_ratio)
    for (e, x), want, got in zip(cases, eager, jitted, strict=True):
        np.testing.assert_allclose(got, want, 1e-5, 1e-7, err_msg=f"{e.name} {x}")
    np.testing.assert_allclose(vmapped, eager[2], 1e-5, 1e-7)


R = jnp.asarray(np.linspace(0, 1, 8).reshape(2, 4), jnp.float32)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(log_ratio=R[:, :3]), "same shape"),
        (dict(log_ratio=R > 0), "`log_ratio` must have a float"),
        (dict(rewards=R[0]), r"`rewards` must have shape \[B, N\]"),
        (dict(estimator=E.LOO), "`estimator` must be one of .*S.*LOO_MINUS_ONE.*L2O"),
        (dict(estimator=E.CENTERED), "`estimator` must be one of"),
        (dict(estimator="s"), "`estimator` must be one of"),
        (dict(k=5), "`k`=5 needs at least 5"),
        (dict(k=4, estimator=E.L2O), "`k`=4 needs at least 5"),
        (dict(k=2.0), "`k` must be a static Python int"),
        (dict(exact=1), "`exact` must be a bool"),
        (dict(clamp=0.0), "`clamp` must be None or a finite float > 0"),
        (dict(clamp=-0.2), "`clamp` must be"),
        (dict(clamp=float("inf")), "`clamp` must be"),
        (dict(clamp=True), "`clamp` must be"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    args = dict(rewards=R, log_ratio=R, k=2, estimator=E.S) | kwargs
    with pytest.raises(ValueError, match=match):
        off(args.pop("rewards"), args.pop("log_ratio"), args.pop("k"), **args)
