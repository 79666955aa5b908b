"""Sample-compute allocation across sampling configurations (temperatures, prompts, models).

Choose integer sample counts x [C] maximizing the expected fraction of problems solved by
at least one sample, f(x) = mean_p 1 - prod_c (1 - s_pc)^x_c, under sum_c x_c cost_c <=
budget (the OSCA setting of Zhang et al.: mixed allocations can beat every single
configuration). f is monotone and DR-submodular on the integer lattice: adding a sample
of c gains mean_p F_p(x) s_pc with F_p = prod_c (1 - s_pc)^x_c, which only shrinks as x
grows. Replacing each configuration by floor(budget/cost_c) interchangeable copies makes
it a monotone submodular set function under a knapsack, so the classic guarantees apply.
"""

from __future__ import annotations

import enum
import itertools
import math

import numpy as np

from kjax.objectives import binomial

_TOL = 1e-9  # relative slack on the budget, so float costs that sum exactly still fit


class AllocationMethod(enum.Enum):
    EXACT = "exact"  # branch and bound: the optimum (exponential in C at worst)
    GREEDY_ENUM3 = "greedy_enum3"  # Sviridenko 2004: >= (1 - 1/e) OPT
    GREEDY = "greedy"  # max(density greedy, best single configuration): >= (1-1/e)/2 OPT
    AUTO = "auto"  # EXACT on small search spaces, else GREEDY_ENUM3, else GREEDY


EXACT_SPACE = 100_000  # AUTO: exact when prod_c (budget // cost_c + 1) is at most this
ENUM3_SEEDS = 2_000  # AUTO: partial enumeration when C(C + 3, 3) seeds are at most this


def _check(success, costs, budget) -> tuple[np.ndarray, np.ndarray, float]:
    s = np.asarray(success, np.float64)
    c = np.asarray(costs, np.float64)
    if s.ndim != 2 or s.shape[1] < 1:
        raise ValueError(f"`success` must be [P, C] (problems, configurations); got {s.shape}.")
    if c.shape != (s.shape[1],):
        raise ValueError(f"`costs` must be [C] = [{s.shape[1]}]; got shape {c.shape}.")
    if not np.all((s >= 0) & (s <= 1)):
        raise ValueError("`success` must hold probabilities in [0, 1] (no NaN).")
    if not np.all(np.isfinite(c) & (c > 0)):
        raise ValueError(f"`costs` must be finite and > 0; got {c.tolist()}.")
    if not (math.isfinite(budget) and budget >= 0):
        raise ValueError(f"`budget` must be finite and >= 0; got {budget!r}.")
    return s, c, float(budget) * (1 + _TOL) + _TOL


def allocation_value(success, counts) -> float:
    """f(x) = mean_p 1 - prod_c (1 - success[p, c])^counts[c] (plug-in success rates).

    Args:
      success: [P, C] float in [0, 1]. counts: [C] int >= 0.
    """
    s = np.asarray(success, np.float64)
    x = np.asarray(counts, np.int64)
    return float(np.mean(1.0 - np.prod((1.0 - s) ** x, axis=1)))


def unbiased_allocation_value(correct, drawn, counts) -> float:
    """Unbiased estimate of f(x) on problems with m_pc drawn samples, k_pc of them correct.

    prod_c C(m - k, x_c) / C(m, x_c) is the unbiased estimate of the failure probability
    of x_c fresh samples per configuration (pass@k's estimator; independent across c), so
    no plug-in bias from using k/m in place of the success rate.

    Args:
      correct: [P, C] int, k_pc. drawn: [P, C] or [C] int, m_pc >= counts[c].
      counts: [C] int >= 0.
    """
    k = np.asarray(correct, np.int64)
    m = np.broadcast_to(np.asarray(drawn, np.int64), k.shape)
    x = np.broadcast_to(np.asarray(counts, np.int64), k.shape)
    if np.any(m < x):
        raise ValueError(
            f"unbiased_allocation_value needs at least counts[c] samples drawn per problem "
            f"and configuration; drew {m.min()} but counts has {x.max()}. Draw more."
        )
    fail = np.exp(binomial.log_comb(m - k, x) - binomial.log_comb(m, x))
    return float(np.mean(1.0 - np.prod(fail, axis=1)))


def _greedy(s, c, budget, x, fail) -> tuple[np.ndarray, float]:
    """Density greedy from counts x (failure rates fail [P]); skips what no longer fits.

    It goes on while any sample fits, also at zero gain (f never decreases): the budget is
    spent even where the success estimates are all 0."""
    x, fail = x.copy(), fail.copy()
    while True:
        room = budget - float(x @ c)
        fits = c <= room
        if not fits.any():
            return x, float(1.0 - fail.mean())
        gain = fail @ s / len(fail)  # [C] marginal gain of one more sample of each c
        best = int(np.argmax(np.where(fits, gain / c, -1.0)))
        x[best] += 1
        fail = fail * (1.0 - s[:, best])


def _single_best(s, c, budget) -> tuple[np.ndarray, float]:
    best_x, best_v = np.zeros(len(c), np.int64), 0.0
    for j in range(len(c)):
        x = np.zeros(len(c), np.int64)
        x[j] = int(budget // c[j])
        v = allocation_value(s, x)
        if v > best_v:
            best_x, best_v = x, v
    return best_x, best_v


def _enum3(s, c, budget) -> tuple[np.ndarray, float]:
    best_x, best_v = np.zeros(len(c), np.int64), 0.0
    for size in range(4):
        for seed in itertools.combinations_with_replacement(range(len(c)), size):
            x = np.bincount(np.asarray(seed, np.int64), minlength=len(c)).astype(np.int64)
            if x @ c > budget:
                continue
            fail = np.prod((1.0 - s) ** x, axis=1)
            x, v = _greedy(s, c, budget, x, fail)
            if v > best_v + 1e-15:
                best_x, best_v = x, v
    return best_x, best_v


def _exact(s, c, budget) -> tuple[np.ndarray, float]:
    """Depth-first over configurations, counts tried from high to low, pruned by the bound
    f(x + y) <= min(f(x) + R max_c gain_c / cost_c, f(x + every remaining c at its max))
    (the first from DR-submodularity: later gains never exceed today's)."""
    order = np.argsort(-(s.mean(axis=0) / c))  # good configurations first: early incumbents
    s, c = s[:, order], c[order]
    C = len(c)
    best = [np.zeros(C, np.int64), 0.0]
    x = np.zeros(C, np.int64)

    def visit(j, fail, room):
        value = 1.0 - fail.mean()
        if value > best[1] + 1e-15:
            best[0], best[1] = x.copy(), value
        if j == C:
            return
        rest = slice(j, C)
        gain = fail @ s[:, rest] / len(fail)
        caps = np.floor(room / c[rest])
        all_max = 1.0 - np.mean(fail * np.prod((1.0 - s[:, rest]) ** caps, axis=1))
        if min(value + room * float(np.max(gain / c[rest])), all_max) <= best[1] + 1e-15:
            return
        for count in range(int(caps[0]), -1, -1):
            x[j] = count
            visit(j + 1, fail * (1.0 - s[:, j]) ** count, room - count * c[j])
        x[j] = 0

    visit(0, np.ones(len(s)), budget)
    out = np.zeros(C, np.int64)
    out[order] = best[0]
    return out, best[1]


def allocate(
    success, costs, budget: float, *, method: AllocationMethod = AllocationMethod.AUTO
) -> np.ndarray:
    """Sample counts per configuration maximizing f(x) = mean_p 1 - prod_c (1-s_pc)^x_c
    subject to sum_c x_c cost_c <= budget.

    Methods (`AllocationMethod`):
      EXACT: branch and bound over count vectors; returns an optimum (equal in value to
        exhaustive search). Worst case prod_c (budget // cost_c + 1) nodes.
      GREEDY_ENUM3: Sviridenko's partial enumeration (2004): every multiset of <= 3
        samples, each completed by the density greedy (largest gain per unit cost among
        samples that still fit); the best result is >= (1 - 1/e) OPT. O(C^3) greedy runs,
        each O(P C budget / min cost).
      GREEDY: the better of one density-greedy run and the best single configuration
        (all budget on it): >= (1 - 1/e)/2 OPT (Khuller, Moss & Naor 1999). O(P C steps).
      AUTO: EXACT when the search space is at most EXACT_SPACE vectors, else
        GREEDY_ENUM3 when C(C + 3, 3) <= ENUM3_SEEDS, else GREEDY.

    Args:
      success: [P, C] float in [0, 1], per-problem success rate of each configuration
        (estimated on training problems).
      costs: [C] float > 0, cost of one sample (e.g. tokens, or 1 per sample).
      budget: float >= 0.
      method: an AllocationMethod.

    Returns:
      [C] int64 counts; always feasible. Budget the method leaves over is spent by the
      density greedy (never lowers f), so no sample that fits is left undrawn.
    """
    s, c, room = _check(success, costs, budget)
    method = AllocationMethod(method)
    if method is AllocationMethod.AUTO:
        space = math.prod(int(room // ci) + 1 for ci in c)
        if space <= EXACT_SPACE:
            method = AllocationMethod.EXACT
        elif math.comb(len(c) + 3, 3) <= ENUM3_SEEDS:
            method = AllocationMethod.GREEDY_ENUM3
        else:
            method = AllocationMethod.GREEDY
    if method is AllocationMethod.EXACT:
        x = _exact(s, c, room)[0]
    elif method is AllocationMethod.GREEDY_ENUM3:
        x = _enum3(s, c, room)[0]
    else:
        greedy = _greedy(s, c, room, np.zeros(len(c), np.int64), np.ones(len(s)))
        single = _single_best(s, c, room)
        x = greedy[0] if greedy[1] >= single[1] else single[0]
    return _greedy(s, c, room, x, np.prod((1.0 - s) ** x, axis=1))[0]  # spend what is left
