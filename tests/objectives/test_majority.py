"""maj@k metric and advantages against subset enumeration, exact unbiasedness, properties.

Compilation dominates the run time, so the small-N tests share a few jitted functions
and one batch shape ([B_SMALL, N], int32 answers, float64 under enable_x64).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kjax.objectives.majority import majority_at_k, majority_at_k_advantages
from kjax.objectives.reference_majority import (
    majority_at_k_advantages_ref,
    majority_at_k_ref,
    vote_outcome,
)
from tests.objectives.helpers import all_outcomes, expected_score_gradient

B_SMALL = 12


def _jit(fn, **kw):
    # Optimisation level 0 roughly halves XLA:CPU compile time; results are unchanged.
    return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0}, **kw)


@functools.cache
def _outputs(ks: tuple[int, ...]):
    """One jitted function giving {k: (metric, advantages, centred advantages)} for every
    k in `ks`: one compile per (shape, ks); XLA shares the common work."""

    def f(answers, target):
        return {
            k: (
                majority_at_k(answers, target, k),
                majority_at_k_advantages(answers, target, k),
                majority_at_k_advantages(answers, target, k, centered=True),
            )
            for k in ks
        }

    return _jit(f)


def _every_k(answers, target) -> dict[int, tuple[np.ndarray, ...]]:
    out = _outputs(tuple(range(1, answers.shape[1] + 1)))(answers, target)
    return {k: tuple(map(np.asarray, v)) for k, v in out.items()}


def _small_batch(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """[B_SMALL, n] answers in {-1..3} (ties, abstentions) with the edge cases as rows."""
    answers = rng.integers(-1, 4, size=(B_SMALL, n)).astype(np.int32)
    target = rng.integers(0, 3, size=B_SMALL).astype(np.int32)
    answers[0] = -1  # all abstain
    answers[1] = target[1]  # a single class, correct
    answers[2] = 5  # a single class, wrong
    answers[3] = np.arange(n)  # all distinct
    target[4] = -1  # no correct class
    answers[5] = rng.integers(0, 2, size=n)  # two classes: many ties
    return answers, target


@pytest.mark.parametrize(
    # N = 4, 6, 7 are slow-tier: 1, 2, 3, 5 and 8 keep odd and even N, ties, and the largest.
    "n",
    [n if n not in (4, 6, 7) else pytest.param(n, marks=pytest.mark.slow) for n in range(1, 9)],
)
def test_matches_subset_enumeration_every_k(n):
    answers, target = _small_batch(np.random.default_rng(n), n)
    with jax.enable_x64(True):
        outputs = _every_k(answers, target)
    for k, (metric, adv, centred) in outputs.items():
        assert metric.dtype == np.float64
        np.testing.assert_allclose(metric, majority_at_k_ref(answers, target, k), 1e-9, 1e-12)
        np.testing.assert_allclose(
            adv, majority_at_k_advantages_ref(answers, target, k), 1e-9, 1e-12
        )
        np.testing.assert_allclose(
            centred, majority_at_k_advantages_ref(answers, target, k, True), 1e-9, 1e-12
        )


def test_float32_edge_cases_k_1_and_k_n():
    """float32: the edge rows (all abstain, one class, all distinct, no target) stay
    finite and match the oracle at k = 1 and k = N."""
    n = 8
    answers, target = _small_batch(np.random.default_rng(11), n)
    outputs = _outputs((1, n))(answers, target)
    for k, (metric, adv, centred) in outputs.items():
        assert metric.dtype == np.float32
        np.testing.assert_allclose(metric, majority_at_k_ref(answers, target, k), 1e-5, 1e-6)
        np.testing.assert_allclose(
            adv, majority_at_k_advantages_ref(answers, target, k), 1e-5, 1e-6
        )
        np.testing.assert_allclose(
            centred, majority_at_k_advantages_ref(answers, target, k, True), 1e-5, 1e-6
        )


GOLDEN_ANSWERS = [0, 0, 0, 1, 1, 1, 2, 2, -1]
GOLDENS = {1: 0.333333, 2: 0.375, 3: 0.386905, 4: 0.404762, 5: 0.416667, 9: 0.5}


def test_goldens_from_estimators_md():
    answers, target = np.array([GOLDEN_ANSWERS], np.int32), np.array([0], np.int32)
    got = _jit(lambda a, t: {k: majority_at_k(a, t, k) for k in GOLDENS})(answers, target)
    for k, golden in GOLDENS.items():
        assert majority_at_k_ref(answers, target, k)[0] == pytest.approx(golden, abs=6e-7)
        assert float(got[k][0]) == pytest.approx(golden, abs=6e-7), k


# Softmax bandit: answer 0 correct, 1 and 2 wrong, -1 abstains.
BANDIT_LABELS = np.array([0, 1, 2, -1], np.int32)
BANDIT_THETA = np.array([0.3, 0.1, -0.2, -0.5])


@functools.partial(jax.jit, static_argnums=1)
@functools.partial(jax.grad)
def _objective_grad(theta, k: int):
    """grad of J_k(theta) = E over k i.i.d. draws of the vote outcome (A**k outcomes)."""
    if k == 0:
        return jnp.zeros((), theta.dtype)
    outcomes = all_outcomes(len(BANDIT_LABELS), k)
    f = np.array([vote_outcome(BANDIT_LABELS[o], 0) for o in outcomes])
    return jnp.sum(jnp.prod(jax.nn.softmax(theta)[outcomes], axis=-1) * f)


@pytest.mark.parametrize("n,k", [(3, 3), (4, 1), (5, 3)])
def test_exactly_unbiased_and_centred_bias_on_softmax_bandit(n, k):
    outcomes = all_outcomes(len(BANDIT_LABELS), n)  # every sequence of n draws
    answers = BANDIT_LABELS[outcomes]
    target = np.zeros(len(outcomes), np.int32)
    with jax.enable_x64(True):
        theta = jnp.asarray(BANDIT_THETA)
        _, adv, centred = _outputs((k,))(answers, target)[k]
        expected = jax.jit(expected_score_gradient)
        grad = {m: _objective_grad(theta, m) for m in (k, k - 1)}
        np.testing.assert_allclose(expected(theta, outcomes, adv), grad[k], rtol=1e-9, atol=1e-13)
        # Centring (Tang et al.'s variant) is biased by a known mix of J_k and J_{k-1}.
        predicted = (1 - k / n) * grad[k] + (k / n) * grad[k - 1]
        np.testing.assert_allclose(
            expected(theta, outcomes, centred), predicted, rtol=1e-9, atol=1e-13
        )
        assert np.abs(grad[k]).max() > 1e-3  # the check has teeth


def _bounded(caps: list[int], total: int):
    """Every vote-count vector x with 0 <= x_i <= caps_i and sum(x) <= total."""
    if not caps:
        yield ()
        return
    for x in range(min(caps[0], total) + 1):
        for rest in _bounded(caps[1:], total - x):
            yield (x, *rest)


def _count_mean(counts: list[int], abstain: int, m: int, extra: int | None = None) -> Fraction:
    """Exact mean over m-subsets of f(subset, plus one vote for class `extra` if given),
    by enumerating per-class vote counts with integer weights; class 0 is correct."""
    by_ties = {}  # number of tied top classes -> summed subset counts where 0 wins
    for x in _bounded(counts, m):
        if m - sum(x) > abstain:
            continue
        ways = math.comb(abstain, m - sum(x)) * math.prod(map(math.comb, counts, x))
        votes = list(x)
        if extra is not None:
            votes[extra] += 1
        top = max(votes)
        if top > 0 and votes[0] == top:
            by_ties[votes.count(top)] = by_ties.get(votes.count(top), 0) + ways
    total = sum(Fraction(w, j) for j, w in by_ties.items())
    return total / math.comb(sum(counts) + abstain, m)


def _count_advantages(counts: list[int], abstain: int, k: int) -> list[float]:
    """Exact A for a vote of each class (correct first): A = (k/n) mean over (k-1)-subsets
    J of the other samples of f(J + y) - f(J)."""
    n = sum(counts) + abstain
    out = []
    for cls in range(len(counts)):
        others = list(counts)
        others[cls] -= 1
        diff = _count_mean(others, abstain, k - 1, cls) - _count_mean(others, abstain, k - 1)
        out.append(float(diff * Fraction(k, n)))
    return out


def _answers_from_counts(counts: list[int], abstain: int, rng) -> np.ndarray:
    """A shuffled row: counts[0] correct votes (id 0), class i > 0 as id 9 + i, abstains."""
    row = sum(([0 if i == 0 else 9 + i] * c for i, c in enumerate(counts)), []) + [-1] * abstain
    return rng.permutation(np.array(row, np.int32))


def _per_sample(row: np.ndarray, per_class: list[float]) -> list[float]:
    lookup = {-1: 0.0, 0: per_class[0], **{9 + i: a for i, a in enumerate(per_class) if i}}
    return [lookup[int(a)] for a in row]


def test_count_oracle_agrees_with_subset_enumeration():
    rng = np.random.default_rng(0)
    for counts, abstain in [([3, 3, 2], 1), ([2, 1, 1, 2], 2), ([1, 4], 0), ([0, 2], 3)]:
        row = _answers_from_counts(counts, abstain, rng)[None]
        for k in range(1, row.shape[1] + 1):
            ref = majority_at_k_ref(row, np.array([0]), k)[0]
            assert float(_count_mean(counts, abstain, k)) == pytest.approx(ref, abs=1e-12)
            np.testing.assert_allclose(
                majority_at_k_advantages_ref(row, np.array([0]), k)[0],
                _per_sample(row[0], _count_advantages(counts, abstain, k)),
                atol=1e-12,
            )


@pytest.mark.parametrize("k", [1, 16])
def test_float32_large_n(k):
    """N = 256 in float32: no overflow, accurate against exact rational counting and
    against algebra on symmetric groups."""
    n, rng = 256, np.random.default_rng(k)
    groups = [([90, 90, 40, 6], 30), ([40, 60, 60, 60], 36), ([3, 5, 2], 246), ([128, 128], 0)]
    three = np.where(np.arange(n) < n - 1, np.arange(n) % 3, -1)  # 85 votes each, 1 abstains
    answers = np.stack(
        [_answers_from_counts(*g, rng) for g in groups] + [np.arange(n), np.full(n, -1), three]
    ).astype(np.int32)
    target = np.array([0, 0, 0, 0, 7, 0, 1], np.int32)
    metric, adv, _ = map(np.asarray, _outputs((k,))(answers, target)[k])
    assert metric.dtype == adv.dtype == np.float32
    exact = [float(_count_mean(*g, k)) for g in groups]
    np.testing.assert_allclose(metric[:4], exact, rtol=1e-5, atol=1e-7)
    for row, g, a in zip(answers, groups, adv, strict=False):
        np.testing.assert_allclose(a, _per_sample(row, _count_advantages(*g, k)), atol=1e-7)
    # All distinct: a k-way tie, so f = 1/k when the correct sample is drawn: maj@k = 1/n,
    # A = 1/n for it and -1/(n (n-1)) for the others (pivotal only beside it; 0 if k = 1).
    assert metric[4] == pytest.approx(1 / n, rel=1e-5)
    other = -1 / (n * (n - 1)) if k > 1 else 0.0
    np.testing.assert_allclose(adv[4], np.where(np.arange(n) == 7, 1 / n, other), rtol=1e-4)
    assert metric[5] == 0.0 and np.all(adv[5] == 0.0)  # all abstain
    # Three equal classes: each wins (or shares) a third of the subsets that have a vote.
    assert metric[6] == pytest.approx((1 - (k == 1) / n) / 3, rel=1e-5)


SMALL_N = 6


@settings(max_examples=30, deadline=None)
@given(
    answers=hnp.arrays(np.int32, (B_SMALL, SMALL_N), elements=st.integers(-1, 4)),
    target=hnp.arrays(np.int32, (B_SMALL,), elements=st.integers(0, 4)),
    k=st.integers(1, SMALL_N),
    seed=st.integers(0, 2**32 - 1),
)
def test_properties(answers, target, k, seed):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(SMALL_N)
    # Relabel wrong classes injectively; the correct class and abstentions stay.
    new_ids = rng.permutation(100)[:5] + 7
    relabelled = np.where(
        (answers == target[:, None]) | (answers < 0), answers, new_ids[np.maximum(answers, 0)]
    ).astype(np.int32)  # int32 like every other call: no recompilation
    with jax.enable_x64(True):
        metric, adv, _ = _every_k(answers, target)[k]
        p_metric, p_adv, _ = _every_k(answers[:, perm], target)[k]
        r_metric, r_adv, _ = _every_k(relabelled, target)[k]
    # Against the enumeration oracle, not a [0, 1] range check (the metric is clipped to it).
    np.testing.assert_allclose(metric, majority_at_k_ref(answers, target, k), 1e-9, 1e-12)
    np.testing.assert_allclose(adv, majority_at_k_advantages_ref(answers, target, k), 1e-9, 1e-12)
    np.testing.assert_allclose(p_metric, metric, atol=1e-12)
    np.testing.assert_allclose(p_adv, adv[:, perm], atol=1e-12)
    np.testing.assert_allclose(r_metric, metric, atol=1e-12)
    np.testing.assert_allclose(r_adv, adv, atol=1e-12)


def test_eager_per_group_loop_and_vmap_equal_jitted_batch():
    n, k = 5, 3
    answers, target = _small_batch(np.random.default_rng(n), n)  # as in the oracle test
    with jax.enable_x64(True):
        _, adv, _ = _every_k(answers, target)[k]  # batched, under an outer jit
        loop = [
            majority_at_k_advantages(answers[b : b + 1], target[b : b + 1], k) for b in range(6)
        ]
        np.testing.assert_allclose(np.concatenate(loop), adv[:6], 1e-12)
        # vmap over an extra leading axis (several batches) equals the flat batch.
        stacked = jax.vmap(lambda a, t: majority_at_k_advantages(a, t, k))(
            answers.reshape(2, B_SMALL // 2, n), target.reshape(2, B_SMALL // 2)
        )
        np.testing.assert_allclose(np.reshape(stacked, (B_SMALL, n)), adv, 1e-12)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda a, t: majority_at_k(a, t, 0), "`k`"),
        (lambda a, t: majority_at_k(a, t, 5), "`k`"),
        (lambda a, t: majority_at_k(a, t, 2.0), "`k`"),
        (lambda a, t: majority_at_k_advantages(a, t, True), "`k`"),
        (lambda a, t: majority_at_k(a.astype(np.float32), t, 2), "`answers`"),
        (lambda a, t: majority_at_k(a[0], t, 2), "`answers`"),
        (lambda a, t: majority_at_k_advantages(a, t[:1], 2), "`target`"),
        (lambda a, t: majority_at_k_advantages(a, t[:, None], 2), "`target`"),
        (lambda a, t: majority_at_k(a, t.astype(np.float32), 2), "`target`"),
    ],
)
def test_invalid_input_raises_value_error_naming_argument(call, name):
    answers = np.zeros((2, 4), np.int32)
    target = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match=name):
        call(answers, target)
