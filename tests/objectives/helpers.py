"""Shared test inputs and the softmax-bandit enumeration used by the unbiasedness tests."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np


def rewards_with_ties(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """[b, n] float64 rewards: half the rows from a 3-value grid (many ties), half continuous."""
    grid = rng.choice([0.0, 0.5, 1.0], size=(b, n))
    cont = rng.uniform(-1.0, 2.0, size=(b, n))
    return np.where(np.arange(b)[:, None] % 2 == 0, grid, cont)


def all_outcomes(num_answers: int, n: int) -> np.ndarray:
    """[A**n, n] int: every sequence of n draws from A answers."""
    return np.array(list(itertools.product(range(num_answers), repeat=n)), dtype=np.int32)


def expected_score_gradient(theta, outcomes, advantages, scale=1.0):
    """E over outcomes of scale * sum_i A_i grad_theta log softmax(theta)[y_i], exactly.

    theta: [A]; outcomes: [M, n] answer indices; advantages: [M, n].
    """
    p = jax.nn.softmax(theta)
    log_prob = jnp.sum(jnp.log(p)[outcomes], axis=-1)  # [M]
    weights = jnp.exp(log_prob)
    # grad log pi(a) = onehot(a) - p, so sum_i A_i grad log pi(y_i) is linear in one-hots.
    onehot = jax.nn.one_hot(outcomes, theta.shape[0], dtype=theta.dtype)  # [M, n, A]
    per_outcome = jnp.einsum("mn,mna->ma", advantages, onehot) - advantages.sum(-1)[:, None] * p
    return scale * jnp.einsum("m,ma->a", weights, per_outcome)


def expected_max_of_k(theta, values, k):
    """J_k(theta) = E[max of k i.i.d. draws] by enumerating all A**k outcomes."""
    outcomes = all_outcomes(theta.shape[0], k)
    p = jax.nn.softmax(theta)
    probs = jnp.prod(p[outcomes], axis=-1)
    return jnp.sum(probs * jnp.max(jnp.asarray(values)[outcomes], axis=-1))
