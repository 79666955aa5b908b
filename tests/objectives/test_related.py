"""BoN-aware weights (Chow et al.), self-certainty and Borda voting (Kang et al.)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.objectives import related


@pytest.mark.parametrize("n", [1, 2, 8, 32])
def test_bon_weight_is_the_log_derivative_of_pass_at_n(n):
    def log_pass(log_q):  # log pass@N as a function of log success probability
        return jnp.log1p(-((1.0 - jnp.exp(log_q)) ** n))

    p = np.array([0.05, 0.3, 0.5, 0.9, 0.99])
    with jax.enable_x64(True):
        want = np.array([jax.grad(log_pass)(jnp.log(1.0 - pi)) for pi in p])
        got = related.bon_aware_weight(jnp.asarray(p), n)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_bon_weight_float32_limits():
    p = jnp.array([0.0, 1e-7, 0.5, 1 - 1e-6, 1.0], jnp.float32)
    w = np.asarray(related.bon_aware_weight(p, 16))
    assert np.all(np.isfinite(w)) and np.all((w >= 0) & (w <= 1))
    assert w[0] == 0.0 and w[-1] == 1.0
    assert np.all(np.diff(w) >= 0)  # harder prompts weigh more
    np.testing.assert_allclose(w[3], 1.0, atol=1e-4)


def test_self_certainty_equals_kl_from_uniform():
    rng = np.random.default_rng(0)
    b, n, t, v, pad = 2, 3, 4, 7, 3
    logits = rng.normal(size=(b, n, t, v + pad)) * 2
    mask = rng.random((b, n, t)) < 0.7
    mask[0, 0] = False  # a response with no valid tokens scores 0
    got = np.asarray(related.self_certainty(jnp.asarray(logits, jnp.float32), mask, v))
    z = logits[..., :v]
    prob = np.exp(z - z.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    kl = np.sum((1.0 / v) * np.log((1.0 / v) / prob), axis=-1)  # KL(U || p)
    want = np.where(mask.any(-1), (kl * mask).sum(-1) / np.maximum(mask.sum(-1), 1), 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def borda_loop(cert, ans, power):
    n = len(cert)
    order = sorted(range(n), key=lambda i: (-cert[i], i))
    votes = {}
    for r, i in enumerate(order, start=1):
        if ans[i] >= 0:
            votes[ans[i]] = votes.get(ans[i], 0.0) + (n - r + 1) ** power
    if not votes:
        return -1
    best = max(votes.values())
    return min(a for a, v in votes.items() if np.isclose(v, best))


@pytest.mark.parametrize("power", [0.0, 1.0, 2.5])
def test_borda_vote_matches_a_loop(power):
    rng = np.random.default_rng(int(power * 10))
    cert = rng.choice([0.1, 0.5, 0.9, 1.3], size=(64, 6)).astype(np.float32)
    ans = rng.integers(-1, 3, size=(64, 6)).astype(np.int32)
    ans[0] = -1  # all abstain
    got = np.asarray(related.borda_vote(cert, ans, power))
    want = [borda_loop(c, a, power) for c, a in zip(cert, ans, strict=True)]
    np.testing.assert_array_equal(got, want)


def test_borda_power_zero_is_majority_and_large_power_is_most_certain():
    cert = jnp.array([[0.1, 0.2, 0.3, 5.0]])
    ans = jnp.array([[1, 1, 1, 2]], jnp.int32)
    assert int(related.borda_vote(cert, ans, 0.0)[0]) == 1
    assert int(related.borda_vote(cert, ans, 20.0)[0]) == 2


def test_bad_inputs():
    with pytest.raises(ValueError, match="`n` must be"):
        related.bon_aware_weight(jnp.array([0.5]), 0)
    with pytest.raises(ValueError, match="`vocab_size`"):
        related.self_certainty(jnp.zeros((1, 1, 2, 4)), jnp.ones((1, 1, 2), bool), 5)
    with pytest.raises(ValueError, match="`answers` must have a int"):
        related.borda_vote(jnp.zeros((1, 3)), jnp.zeros((1, 3)))
