"""Inference-time strategies: best-of-N selection, accuracy-vs-n curves, sample allocation.

Selectors ([B, N] candidates -> chosen indices [B]): select_by_score (a verifier's or
reward model's score), select_by_reward (a scalar reward function), select_by_self_certainty
and select_by_borda (Kang et al. 2025), select_by_majority (self-consistency).
Curves: best_of_n_accuracy (exact U-statistic), subset_accuracy (any selector).
Allocation across sampling configurations: allocate (Zhang et al.'s OSCA objective).
LiveBench-format scoring lives in `kjax.inference.livebench`.
"""

from kjax.inference.allocation import (
    AllocationMethod,
    allocate,
    allocation_value,
    unbiased_allocation_value,
)
from kjax.inference.confidence import borda_vote, self_certainty
from kjax.inference.curves import best_of_n_accuracy, subset_accuracy
from kjax.inference.selectors import (
    chosen_correct,
    majority_vote,
    select_by_borda,
    select_by_majority,
    select_by_reward,
    select_by_score,
    select_by_self_certainty,
)

__all__ = [
    "AllocationMethod",
    "allocate",
    "allocation_value",
    "best_of_n_accuracy",
    "borda_vote",
    "chosen_correct",
    "majority_vote",
    "select_by_borda",
    "select_by_majority",
    "select_by_reward",
    "select_by_score",
    "select_by_self_certainty",
    "self_certainty",
    "subset_accuracy",
    "unbiased_allocation_value",
]
