"""The warm-start and evaluation groups of a run's config (TrainConfig.sft, .eval).

A leaf like kjax/rl/config.py, which re-exports these names: option vocabularies only.
"""

from __future__ import annotations

import dataclasses
import enum

from kjax._fields import check_int, coerce_enums, is_real, need

__all__ = ["EvalConfig", "EvalSplit", "SFTConfig", "SFTLoss"]


class EvalSplit(enum.Enum):
    """Which problems `eval` scores: the held-out TEST split (what tables report), or the
    VALIDATION split (task.validation_size problems held out of training, disjoint from
    TEST: what a tuning protocol selects on, so no choice is made on the reported problems)."""

    TEST = "test"
    VALIDATION = "validation"


class SFTLoss(enum.Enum):
    CE = "ce"  # token-mean cross-entropy
    DCO = "dco"  # Chen, Raventos et al. 2025's (DCO) confidence-limiting loss at N = sft.dco_n


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Warm start before RL; cached in `cache_dir` (default <workdir>/sft) by identity."""

    steps: int = 0
    batch_size: int = 64
    learning_rate: float = 3e-3
    loss: SFTLoss = SFTLoss.CE
    dco_n: int = 16
    cache_dir: str = ""
    # The warm start's seed (init, SFT data order). None: the run's seed. A fixed value
    # gives every run seed the same warm start, so seeds vary only the RL: what a paper
    # that fine-tunes one base model varies, and a far smaller paired variance.
    seed: int | None = None

    def __post_init__(self):
        coerce_enums(self, "sft.")
        check_int(self.steps, "config.sft.steps", 0)
        if self.seed is not None:
            check_int(self.seed, "config.sft.seed", 0)
        check_int(self.batch_size, "config.sft.batch_size", 1)
        check_int(self.dco_n, "config.sft.dco_n", 1)
        need(
            is_real(self.learning_rate) and self.learning_rate > 0,
            "sft.learning_rate",
            "must be > 0",
            self.learning_rate,
        )


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 20  # RL steps between evaluations (and at start and end)
    n_eval: int = 16  # samples per held-out problem; k in {1, 2, 4, ..., n_eval}
    problems: int = 64
    temperature: float = 1.0
    split: EvalSplit = EvalSplit.TEST  # VALIDATION needs task.validation_size > 0

    def __post_init__(self):
        coerce_enums(self, "eval.")
        n = self.n_eval
        need(
            isinstance(n, int) and n >= 1 and n & (n - 1) == 0,
            "eval.n_eval",
            "must be a power of 2",
            n,
        )
        check_int(self.every, "config.eval.every", 1)
        check_int(self.problems, "config.eval.problems", 1)
        need(
            is_real(self.temperature) and self.temperature > 0,
            "eval.temperature",
            "must be > 0",
            self.temperature,
        )
