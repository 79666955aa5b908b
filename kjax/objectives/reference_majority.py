"""Slow, obviously correct float64 oracles for majority voting, by k-subset enumeration.

Only for tests and small N (C(N, k) subsets). Semantics as in `kjax.objectives.majority`.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np


def vote_outcome(votes, target: int) -> float:
    """Vote outcome of one subset: 1/(#tied top classes) if `target` is among them, else 0.

    votes: answer-class ids of the subset; negative ids abstain (do not vote). A subset
    with no votes scores 0.
    """
    counts = collections.Counter(int(v) for v in votes if v >= 0)
    if not counts:
        return 0.0
    top = max(counts.values())
    winners = [c for c, m in counts.items() if m == top]
    return 1.0 / len(winners) if int(target) in winners else 0.0


def majority_at_k_ref(answers, target, k: int) -> np.ndarray:
    """Mean vote outcome over all k-subsets of each group. answers: [B, N]; target: [B]."""
    answers, target = np.asarray(answers), np.asarray(target)
    out = np.zeros(answers.shape[0], np.float64)
    for b, (row, tgt) in enumerate(zip(answers, target, strict=True)):
        subsets = list(itertools.combinations(row.tolist(), k))
        out[b] = sum(vote_outcome(s, tgt) for s in subsets) / len(subsets)
    return out


def majority_at_k_advantages_ref(answers, target, k: int, centered: bool = False) -> np.ndarray:
    """A_i = (1/C(n,k)) sum over k-subsets I containing i of [f(I) - f(I minus i)]; [B, N].

    centered=True subtracts the per-group mean of A (Tang et al.'s biased variant).
    """
    answers, target = np.asarray(answers), np.asarray(target)
    n = answers.shape[1]
    out = np.zeros(answers.shape, np.float64)
    for b, (row, tgt) in enumerate(zip(answers, target, strict=True)):
        for subset in itertools.combinations(range(n), k):
            full = vote_outcome(row[list(subset)], tgt)
            for i in subset:
                rest = [j for j in subset if j != i]
                out[b, i] += full - vote_outcome(row[rest], tgt)
    out /= math.comb(n, k)
    if centered:
        out -= out.mean(axis=1, keepdims=True)
    return out
