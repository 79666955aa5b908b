"""best_of_n_accuracy against subset enumeration (with ties); subset_accuracy."""

import itertools

import jax
import numpy as np
import pytest

from kjax import inference, objectives
from kjax.inference import curves


def best_of_n_enum(scores, correct, n):
    """Mean over all n-subsets of the tie-split correctness of the top-scored samples."""
    vals = []
    for sub in itertools.combinations(range(len(scores)), n):
        top = max(scores[i] for i in sub)
        tied = [i for i in sub if scores[i] == top]
        vals.append(np.mean([correct[i] for i in tied]))
    return float(np.mean(vals))


@pytest.mark.parametrize("N", [1, 2, 5, 7])
def test_best_of_n_matches_enumeration_with_ties(N):
    rng = np.random.default_rng(N)
    scores = rng.choice([0.0, 0.25, 0.5, 1.0], size=(40, N)).astype(np.float32)
    correct = rng.random((40, N)) < 0.5
    for n in range(1, N + 1):
        got = np.asarray(inference.best_of_n_accuracy(scores, correct, n))
        want = [best_of_n_enum(s, c, n) for s, c in zip(scores, correct, strict=True)]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_best_of_n_special_cases():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(16, 9)).astype(np.float32)
    correct = rng.random((16, 9)) < 0.3
    np.testing.assert_allclose(
        inference.best_of_n_accuracy(scores, correct, 1), correct.mean(1), rtol=1e-6
    )
    top = correct[np.arange(16), scores.argmax(1)]
    np.testing.assert_allclose(inference.best_of_n_accuracy(scores, correct, 9), top)
    # A perfect verifier (score = correctness) turns best-of-n into pass@n.
    for n in (1, 3, 9):
        np.testing.assert_allclose(
            inference.best_of_n_accuracy(correct.astype(np.float32), correct, n),
            objectives.pass_at_k(correct, n),
            rtol=1e-6,
        )
    # NaN scores rank lowest: with one real score, best-of-N picks it.
    nan = np.full((1, 3), np.nan, np.float32)
    nan[0, 2] = 0.0
    assert float(inference.best_of_n_accuracy(nan, np.array([[0, 0, 1]], bool), 3)[0]) == 1.0


def test_best_of_n_rejects_n_above_N():
    with pytest.raises(ValueError, match="N=3"):
        inference.best_of_n_accuracy(np.zeros((2, 3), np.float32), np.zeros((2, 3), bool), 4)
    with pytest.raises(ValueError, match="same shape"):
        inference.best_of_n_accuracy(np.zeros((2, 3), np.float32), np.zeros((2, 4), bool), 1)


def _subset_values(scores, correct, n):
    """[C(N, n)] float64: for every n-subset, the mean over prompts of the correctness of
    its top-scored sample (scores without ties)."""
    combos = np.array(list(itertools.combinations(range(scores.shape[1]), n)))  # [C, n]
    top = scores[:, combos].argmax(-1)  # [B, C], an index into each subset
    picked = np.take_along_axis(combos[None], top[..., None], -1)[..., 0]  # [B, C]
    return np.take_along_axis(correct, picked, 1).mean(0)


def test_subset_accuracy_exact_when_every_subset_fits():
    """max_subsets >= C(8, n): every subset once. A float32 mean of 0/1 values equals the
    float64 enumeration up to the rounding of its final division (< 2^-23 relative)."""
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(32, 8)).astype(np.float32)  # no ties: selection is unique
    correct = rng.random((32, 8)) < 0.4
    key = jax.random.key(0)
    for n, S in [(1, 256), (2, 256), (8, 256), (4, 70)]:
        got = inference.subset_accuracy(
            inference.select_by_score, (scores,), correct, n, key=key, max_subsets=S
        )
        want = [best_of_n_enum(s, c, n) for s, c in zip(scores, correct, strict=True)]
        np.testing.assert_allclose(got, want, rtol=2**-22, atol=0)


def test_subset_accuracy_monte_carlo_within_five_standard_errors():
    """max_subsets = S < C(16, 8) = 12870: the mean over S uniform random subsets, unbiased
    with standard error sd / sqrt(S), sd that of one subset's value over all of them."""
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(32, 16)).astype(np.float32)
    correct = rng.random((32, 16)) < 0.4
    key = jax.random.key(0)
    values = _subset_values(scores, correct, 8)
    np.testing.assert_allclose(  # the exact mean the estimate is compared with
        values.mean(), np.mean(inference.best_of_n_accuracy(scores, correct, 8)), rtol=1e-6
    )
    for S in (64, 4096):  # 5 standard errors: 0.048, then 0.006
        assert curves.subsets(16, 8, S, key).shape == (S, 8)  # sampled, not enumerated
        mc = inference.subset_accuracy(
            inference.select_by_score, (scores,), correct, 8, key=key, max_subsets=S
        )
        assert abs(float(np.mean(mc)) - values.mean()) < 5 * values.std() / np.sqrt(S)
