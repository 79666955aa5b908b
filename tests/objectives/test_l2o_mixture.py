"""L2O and mixtures over k: the identities of docs/estimators.md section 2, float32 at
N = 4096, CHEN_ANALYTIC under jit, exact zeros, and the errors. (Oracles:
test_against_oracles; unbiasedness: test_unbiased.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax import objectives as obj
from tests.objectives.helpers import rewards_with_ties

E = obj.MaxAtKEstimator
NK_BELOW = [(n, k) for n in (3, 8) for k in range(1, n)]  # N > k: L2O is defined


@pytest.mark.parametrize(("n", "k"), NK_BELOW)
def test_centred_s_and_chen_are_l2o_rescaled(n, k):
    """centred S = (1 - k/N) L2O; binary CHEN * sigma = ((N-k)/k) L2O (sigma from pass@k)."""
    rng = np.random.default_rng(10 * n + k)
    rewards = rewards_with_ties(rng, 6, n)
    binary = (rng.random((8, n)) < 0.5).astype(np.float64)
    binary[0], binary[1] = 0.0, 1.0  # sigma = 0: Chen's advantage is 0, and so is L2O
    with jax.enable_x64(True):
        l2o = np.asarray(obj.max_at_k_advantages(rewards, k, E.L2O))
        s = np.asarray(obj.max_at_k_advantages(rewards, k, E.S))
        np.testing.assert_allclose(s - s.mean(-1, keepdims=True), (1 - k / n) * l2o, atol=1e-12)
        chen = np.asarray(obj.max_at_k_advantages(binary, k, E.CHEN_ANALYTIC))
        big_r = np.asarray(obj.pass_at_k(binary > 0.5, k))[:, None]
        sigma = np.sqrt(big_r * (1 - big_r))
        l2o_binary = np.asarray(obj.max_at_k_advantages(binary, k, E.L2O))
    np.testing.assert_allclose(chen * sigma, (n - k) / k * l2o_binary, atol=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_k1_is_rloo_over_n(n):
    rewards = rewards_with_ties(np.random.default_rng(n), 6, n)
    with jax.enable_x64(True):
        rloo = np.asarray(obj.mean_advantages(rewards, obj.MeanBaseline.RLOO)) / n
        for e in (E.L2O, E.LOO_MINUS_ONE, E.CENTERED):
            got = obj.max_at_k_advantages(rewards, 1, e)
            np.testing.assert_allclose(got, rloo, atol=1e-12, err_msg=str(e))


@pytest.mark.parametrize("estimator", [e for e in E if e is not E.CHEN_ANALYTIC])
def test_single_weight_mixture_is_that_k_estimator(estimator):
    # max_at_k_advantages is the mixture {k: 1} internally, so this checks the mixture's
    # plumbing (weights scale, key order, validation) rather than new math; the math is
    # checked against enumeration in test_against_oracles.
    rewards = rewards_with_ties(np.random.default_rng(0), 4, 7)
    with jax.enable_x64(True):
        for k in range(1, 7):
            want = np.asarray(obj.max_at_k_advantages(rewards, k, estimator))
            got = obj.max_at_k_mixture_advantages(rewards, {k: 1.0}, estimator=estimator)
            np.testing.assert_array_equal(got, want)
            scaled = obj.max_at_k_mixture_advantages(rewards, {k: 2.5}, estimator=estimator)
            np.testing.assert_allclose(scaled, 2.5 * want, rtol=1e-12, atol=1e-14)


def test_mixture_sorts_once_for_all_k():
    def sorts(fn):
        jaxpr = jax.make_jaxpr(fn)(jnp.zeros((4, 64)))
        return sum(eqn.primitive.name == "sort" for eqn in jaxpr.jaxpr.eqns)

    one_k = sorts(lambda r: obj.max_at_k_advantages(r, 8, E.L2O))
    for e in (E.L2O, E.LOO_MINUS_ONE, E.S, E.LOO):
        mixed = sorts(
            lambda r, e=e: obj.max_at_k_mixture_advantages(r, obj.maxrl_weights(16), estimator=e)
        )
        assert mixed == one_k, (e, mixed, one_k)


def l2o_float64(rewards: np.ndarray, k: int) -> np.ndarray:
    """m_k(all) - m_k(all but i) in float64 numpy, from max@k weights by the downward
    recursion w_n = k/n, w_(i-1) = w_i (i-k)/(i-1) (not kjax's tables), leaving out each
    sample by prefix and suffix sums over the sorted rewards."""

    def weights(n):
        w = np.zeros(n)
        w[-1] = k / n
        for i in range(n, 1, -1):
            w[i - 2] = w[i - 1] * (i - k) / (i - 1)
        return w

    n = rewards.shape[1]
    order = np.argsort(rewards, axis=1, kind="stable")
    r = np.take_along_axis(rewards, order, axis=1)
    rest = weights(n - 1)
    same, down = np.append(rest, 0.0) * r, np.insert(rest, 0, 0.0) * r  # rank j / j - 1
    m_rest = (np.cumsum(same, 1) - same) + (np.cumsum(down[:, ::-1], 1)[:, ::-1] - down)
    a_sorted = (r @ weights(n))[:, None] - m_rest
    out = np.empty_like(a_sorted)
    np.put_along_axis(out, order, a_sorted, axis=1)
    return out


@pytest.mark.parametrize("k", [1, 64, 4000, 4095])
def test_l2o_float32_at_n4096_matches_float64(k):
    n, rng = 4096, np.random.default_rng(k)
    rows = [np.round(rng.uniform(0, 1, n), 2), rng.uniform(0, 1, n), rng.uniform(-1, 1, n) ** 3 + 5]
    rewards = np.stack(rows).astype(np.float32).astype(np.float64)  # same input in both
    want = l2o_float64(rewards, k)
    got = np.asarray(obj.max_at_k_advantages(jnp.asarray(rewards, jnp.float32), k, E.L2O))
    assert got.dtype == np.float32
    # Measured: <= 1.5e-7 of each row's largest |A| (the float64 reference itself agrees
    # with kjax's float64 run to ~3e-11 of it); + tiny: values below float32's normal
    # range flush to 0.
    tol = 2e-6 * np.abs(want).max(-1, keepdims=True) + np.finfo(np.float32).tiny
    assert np.all(np.abs(got - want) <= tol), np.abs(got - want).max()
    assert np.abs(want[1:]).max() > 1e-6  # the continuous rows carry signal at every k


def test_all_equal_groups_give_exact_zeros_in_float32():
    equal = jnp.full((2, 6), 0.1, jnp.float32)
    naive = np.asarray(equal - jnp.mean(equal, axis=-1, keepdims=True))
    assert np.any(naive != 0)  # the float32 mean of 0.1 repeated is not 0.1: the test has teeth
    for b in obj.MeanBaseline:
        assert np.all(np.asarray(obj.mean_advantages(equal, b)) == 0), b
    for e in (E.L2O, E.LOO_MINUS_ONE, E.CENTERED):
        for k in (1, 3, 5):
            assert np.all(np.asarray(obj.max_at_k_advantages(equal, k, e)) == 0), (e, k)
    assert np.all(np.asarray(obj.max_at_k_mixture_advantages(equal, obj.maxrl_weights(5))) == 0)


def test_chen_flags_non_binary_groups_under_jit_and_keeps_nan():
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 0.5, 0.0, 0.0], [1.0, jnp.nan, 0.0, 0.0]])
    chen = jax.jit(lambda r: obj.max_at_k_advantages(r, 2, E.CHEN_ANALYTIC))(rewards)
    eager = obj.max_at_k_advantages(rewards[:1], 2, E.CHEN_ANALYTIC)
    np.testing.assert_allclose(chen[:1], eager, rtol=1e-6)
    assert np.all(np.isfinite(chen[0])) and np.abs(chen[0]).max() > 0.1
    assert np.all(np.isnan(chen[1:]))  # a 0.5 cannot be checked under jit: NaN, not a guess
    nan_row = obj.max_at_k_advantages(rewards[2:], 2, E.CHEN_ANALYTIC)  # eager: NaN stays NaN
    assert np.all(np.isnan(nan_row))
    with pytest.raises(ValueError, match="must be binary"):
        obj.max_at_k_advantages(rewards[1:2], 2, E.CHEN_ANALYTIC)


def test_nan_rewards_propagate():
    rewards = jnp.array([[0.2, jnp.nan, 0.9, 0.4]])
    for e in (E.S, E.LOO, E.L2O, E.LOO_MINUS_ONE, E.CENTERED):
        assert np.isnan(np.asarray(obj.max_at_k_advantages(rewards, 2, e))).any(), e
    for b in obj.MeanBaseline:
        assert np.isnan(np.asarray(obj.mean_advantages(rewards, b))).all(), b


R = jnp.asarray(np.linspace(0, 1, 8).reshape(2, 4), jnp.float32)
MIX = obj.max_at_k_mixture_advantages


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: obj.max_at_k_advantages(R, 4, E.L2O), "`k`=4 needs at least 5 .* N=4"),
        (lambda: MIX(R, {1: 1.0, 5: 1.0}), "k=5, which needs at least 5 .* N=4"),
        (lambda: MIX(R, {4: 1.0}, estimator=E.L2O), "k=4, which needs at least 5 .* N=4"),
        (lambda: MIX(R, {2: -0.5}), r"`weights`\[2\] must be a finite float >= 0"),
        (lambda: MIX(R, {2: float("nan")}), r"`weights`\[2\] must be a finite float"),
        (lambda: MIX(R, {2.0: 1.0}), "`weights` keys must be ints"),
        (lambda: MIX(R, {0: 1.0}), "`weights` keys must be ints k >= 1"),
        (lambda: MIX(R, {}), "`weights` must be a non-empty mapping"),
        (lambda: MIX(R, [(2, 1.0)]), "`weights` must be a non-empty mapping"),
        (lambda: MIX(R, {2: 1.0}, estimator=E.CHEN_ANALYTIC), "CHEN_ANALYTIC cannot be mixed"),
        (lambda: MIX(R, {2: 1.0}, estimator="l2o"), "`estimator` must be a MaxAtKEstimator"),
        (lambda: MIX(R > 0.5, {2: 1.0}), "`rewards` must have a float dtype"),
        (lambda: obj.maxrl_weights(0), "`T`"),
        (lambda: obj.maxrl_weights(2.0), "`T`"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_maxrl_weights():
    assert obj.maxrl_weights(3) == {1: 1.0, 2: 0.5, 3: 1 / 3}
