"""Selectors on hand-built candidates (ties, abstentions) and against loops / float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax import inference
from kjax.inference import confidence


def kl_uniform_ref(logits, mask, v):
    """Mean over valid tokens of KL(U_V || softmax(z[:v])) in float64."""
    z = np.asarray(logits, np.float64)[..., :v]
    prob = np.exp(z - z.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    kl = np.sum((1.0 / v) * np.log((1.0 / v) / prob), axis=-1)
    return np.where(mask.any(-1), (kl * mask).sum(-1) / np.maximum(mask.sum(-1), 1), 0.0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_self_certainty_is_float32_kl_from_uniform_without_padding(dtype):
    rng = np.random.default_rng(0)
    b, n, t, v, pad = 2, 3, 4, 7, 3
    logits = (rng.normal(size=(b, n, t, v + pad)) * 2).astype(np.float32)
    logits[..., v:] = 30.0  # padded columns that would dominate if they were counted
    mask = rng.random((b, n, t)) < 0.7
    mask[0, 0] = False  # a response with no valid tokens scores 0
    x = jnp.asarray(logits, dtype)
    got = inference.self_certainty(x, mask, v)
    assert got.dtype == jnp.float32
    want = kl_uniform_ref(np.asarray(x.astype(jnp.float32)), mask, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_select_by_self_certainty_ignores_padded_columns():
    # Sample 0 is peaked on the true vocabulary; sample 1 is flat there but has a huge
    # padded logit, which would make it look most certain if padding were included.
    logits = np.zeros((1, 2, 1, 5), np.float32)
    logits[0, 0, 0, 0] = 4.0
    logits[0, 1, 0, 4] = 50.0
    mask = np.ones((1, 2, 1), bool)
    assert int(inference.select_by_self_certainty(logits, mask, vocab_size=4)[0]) == 0
    assert int(inference.select_by_self_certainty(logits, mask)[0]) == 1
    with pytest.raises(ValueError, match="`vocab_size`"):
        inference.self_certainty(jnp.zeros((1, 1, 2, 4)), jnp.ones((1, 1, 2), bool), 5)


def test_select_by_score_ties_and_nan():
    scores = jnp.array([[0.2, 0.9, 0.9], [jnp.nan, 0.1, 0.0], [jnp.nan, jnp.nan, jnp.nan]])
    np.testing.assert_array_equal(inference.select_by_score(scores), [1, 1, 0])


def test_select_by_reward_uses_the_function():
    cands = [["a", "abc", "ab"], ["xyz", "x", "xyz"]]
    np.testing.assert_array_equal(inference.select_by_reward(cands, len), [1, 0])
    np.testing.assert_array_equal(inference.select_by_reward(cands, lambda c: -len(c)), [0, 1])
    with pytest.raises(ValueError, match="same N"):
        inference.select_by_reward([["a"], ["b", "c"]], len)


def majority_loop(ans):
    counts = {}
    for a in ans:
        if a >= 0:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return 0
    best = max(counts.values())
    return next(i for i, a in enumerate(ans) if a >= 0 and counts[a] == best)


def test_majority_hand_built():
    ans = jnp.array(
        [
            [2, 2, 1, 1, -1],  # tie 2 vs 1: 2 appears first
            [-1, 1, 2, 2, 1],  # tie 1 vs 2: 1 appears first (at index 1)
            [-1, -1, -1, 3, -1],  # abstentions do not vote, however many
            [-1, -1, -1, -1, -1],  # all abstain
            [0, 4, 4, 0, 4],  # class 0 (the reference) gets no favour
        ],
        jnp.int32,
    )
    np.testing.assert_array_equal(inference.select_by_majority(ans), [0, 1, 3, 0, 1])
    np.testing.assert_array_equal(inference.majority_vote(ans), [2, 1, 3, -1, 4])


def test_majority_matches_a_loop_and_jit():
    ans = np.random.default_rng(3).integers(-1, 3, size=(200, 7)).astype(np.int32)
    want = [majority_loop(a) for a in ans]
    np.testing.assert_array_equal(inference.select_by_majority(ans), want)
    np.testing.assert_array_equal(jax.jit(inference.select_by_majority)(ans), want)


def borda_loop(cert, ans, power):
    """Reference Borda: votes per class, ties -> class of the most certain response."""
    n = len(cert)
    order = sorted(range(n), key=lambda i: (-cert[i], i))
    rank = {i: r for r, i in enumerate(order, start=1)}
    votes = {}
    for i in range(n):
        if ans[i] >= 0:
            votes[ans[i]] = votes.get(ans[i], 0.0) + (n - rank[i] + 1) ** power
    if not votes:
        return order[0]
    best = max(votes.values())
    tied = {a for a, v in votes.items() if np.isclose(v, best, rtol=1e-5, atol=0)}
    return next(i for i in order if ans[i] in tied)


@pytest.mark.parametrize("power", [0.0, 1.0, 2.5])
def test_borda_matches_a_loop(power):
    rng = np.random.default_rng(int(power * 10))
    cert = rng.choice([0.1, 0.5, 0.9, 1.3], size=(128, 6)).astype(np.float32)
    ans = rng.integers(-1, 3, size=(128, 6)).astype(np.int32)
    ans[0] = -1  # all abstain
    want = [borda_loop(c, a, power) for c, a in zip(cert, ans, strict=True)]
    np.testing.assert_array_equal(inference.select_by_borda(cert, ans, power), want)
    np.testing.assert_array_equal(
        jax.jit(inference.select_by_borda, static_argnums=2)(cert, ans, power), want
    )
    ids = inference.borda_vote(cert, ans, power)
    np.testing.assert_array_equal(ids, [a[i] for a, i in zip(ans, want, strict=True)])
    assert int(ids[0]) == -1


def test_borda_power_zero_is_majority_and_large_power_is_most_certain():
    cert = jnp.array([[0.1, 0.2, 0.3, 5.0]])
    ans = jnp.array([[1, 1, 1, 2]], jnp.int32)
    assert int(inference.borda_vote(cert, ans, 0.0)[0]) == 1
    assert int(inference.borda_vote(cert, ans, 20.0)[0]) == 2
    assert int(inference.select_by_borda(cert, ans, 20.0)[0]) == 3


def test_borda_tie_goes_to_the_most_certain_not_the_smaller_id():
    ans = jnp.array([[1, 0], [0, 1]], jnp.int32)
    cert = jnp.array([[0.9, 0.5], [0.5, 0.9]])
    np.testing.assert_array_equal(inference.borda_vote(cert, ans, 0.0), [1, 1])


def test_chosen_correct_and_bad_inputs():
    correct = jnp.array([[True, False], [False, True]])
    np.testing.assert_array_equal(inference.chosen_correct(jnp.array([1, 1]), correct), [0, 1])
    with pytest.raises(ValueError, match="`answers` must have a int"):
        inference.borda_vote(jnp.zeros((1, 3)), jnp.zeros((1, 3)))
    with pytest.raises(ValueError, match="`power`"):
        confidence.borda_choice(jnp.zeros((1, 3)), jnp.zeros((1, 3), jnp.int32), -1.0)
    with pytest.raises(ValueError, match="shape \\[B, N\\]"):
        inference.select_by_majority(jnp.zeros((3,), jnp.int32))
