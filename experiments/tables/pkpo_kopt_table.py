"""Walder & Karkhanis 2025 (PKPO): the k used in training (k_opt) trades pass@1 for pass@k.

  python -m experiments.tables.pkpo_kopt_table --workdir=DIR [--seeds=10] [--smoke]

Budget (tiny_countdown, exact hit, CPU; harness.design): one SFT warm start for every seed
(1500 steps of 64), then 200 RL steps of 16 prompts x 16 samples (PG, AdamW, pass@k
objective with PKPO's LOO-minus-one estimator) for k_opt in {1, 2, 4, 8, 16} and
k-annealing 8 -> 1 (k=8 for the first 100 steps, then 1), each arm's learning rate from
{2.5e-4, 5e-4, 1e-3} by experiments.lab.tuning's protocol. Evaluation: 1000 held-out problems,
32 samples each, unbiased pass@k for k in {1, 2, 4, 8, 16}. 6 arms x 10 seeds plus 36
tuning runs: 35.0 minutes measured on 2 CPU cores with table 1's warm start and its 16
identical runs reused (--sft_dir, --reuse_runs; docs/tables/pkpo_kopt.md), 17.6 on arithmetic.

The task is Countdown with the exact-hit reward (tiny_countdown.EXACT_BASE): the testbed
where mean-reward RL lowers pass@k below the warm start (docs/results.md, The testbed); the
earlier 2-digit arithmetic run is in experiments/results/arith/.
"""

from __future__ import annotations

import dataclasses
import sys

from experiments.configs import tiny_countdown
from experiments.lab import harness, table_cli
from experiments.lab.claims import Claim, ClaimKind
from experiments.lab.harness import Arm
from experiments.lab.tuning import Tuning
from kjax.rl.config import KSchedule, KScheduleKind, Objective, ObjectiveConfig

STEPS, B, N = 200, 16, 16
LEARNING_RATES = (2.5e-4, 5e-4, 1e-3)
KS = (1, 2, 4, 8, 16)


def base(seed: int, smoke: bool):
    cfg = tiny_countdown.EXACT_BASE
    return harness.smoke_base(cfg) if smoke else harness.design(cfg, STEPS, B, N)


def k_opt(k: int):
    def make(cfg):
        k_eff = min(k, cfg.samples)  # smoke runs sample fewer than 16
        return dataclasses.replace(cfg, objective=ObjectiveConfig(Objective.MAX_AT_K, k=k_eff))

    return make


def anneal(cfg):
    """PKPO's k-annealing: k_opt = 8 for the first half of training, then 1."""
    k = min(8, cfg.samples)
    schedule = KSchedule(KScheduleKind.STEP, k_start=k, k_end=1, steps=max(1, cfg.steps // 2))
    return dataclasses.replace(
        cfg, objective=ObjectiveConfig(Objective.MAX_AT_K, k=k), k_schedule=schedule
    )


PAPER = "Llama-3.1-8B MATH: pass@1/pass@16 51.15/56.83 (k_opt=1) vs 48.63/61.88 (k_opt=8)"
ANNEAL = (
    "PKPO anneals after 1500 steps with PPO; kjax's schedule is half and half (k_opt = 8 "
    "for 100 of 200 steps, then 1) with PG"
)
RESTATED = "restated as PKPO's body states it after the rows were seen"
TABLE = harness.Table(
    name="pkpo_kopt_table",
    title="PKPO: k_opt in training vs held-out pass@k (tiny_countdown, exact hit)",
    arms=(*(Arm(f"k_opt={k}", k_opt(k)) for k in KS), Arm("anneal 8->1", anneal)),
    claims=(
        Claim(
            "2a",
            f"larger k_opt raises pass@16 ({PAPER})",
            "pass@16",
            "k_opt=8",
            "k_opt=1",
            paper_effect=0.0505,
            paper_number="+0.051 pass@16",
        ),
        Claim(
            "2b",
            "larger k_opt lowers pass@1 (51.15 -> 48.63)",
            "pass@1",
            "k_opt=8",
            "k_opt=1",
            ClaimKind.LESS,
            paper_effect=-0.0252,
            paper_number="-0.025 pass@1",
        ),
        Claim(
            "2c",
            "kjax, not the paper: k_opt = 16 (= N, the k = N setting of Tang et al. 2025; "
            "PKPO's grid stops at 8) also raises pass@16 over k_opt = 1",
            "pass@16",
            "k_opt=16",
            "k_opt=1",
        ),
        Claim(
            "2d",
            "kjax, not the paper: annealing recovers pass@1 over k_opt = 8",
            "pass@1",
            "anneal 8->1",
            "k_opt=8",
        ),
        # 2e-2e.8 and 2d' are PKPO's annealing claim as its body states it (section
        # "Improving pass@k without sacrificing pass@1": annealing k_opt 8 -> 1 gives higher
        # pass@k_eval for every k_eval > 1 with no sacrifice in pass@1, both against
        # k_opt = 1), restated in issue 46 after every row had been seen; 2e was written
        # first as kjax's, 2d'/2e' first as PKPO's with kjax's 0.02 margin.
        Claim(
            "2e",
            f"annealing k_opt 8 -> 1 beats k_opt = 1 on pass@16 ({ANNEAL}; {RESTATED})",
            "pass@16",
            "anneal 8->1",
            "k_opt=1",
        ),
        *(
            Claim(
                f"2e.{k}",
                f"... on pass@{k} ({RESTATED})",
                f"pass@{k}",
                "anneal 8->1",
                "k_opt=1",
            )
            for k in (2, 4, 8)
        ),
        Claim(
            "2d'",
            "... with no sacrifice in pass@1 against k_opt = 1: non-inferiority at margin 0 "
            "(PKPO states no margin; 'no sacrifice' read as none; first written as 'at most "
            f"0.02 below', kjax's margin; {RESTATED})",
            "pass@1",
            "anneal 8->1",
            "k_opt=1",
            ClaimKind.NONINFERIOR,
            margin=0.0,
        ),
        Claim(
            "2e'",
            "kjax, not the paper: annealing's pass@16 at most 0.02 below k_opt = 8's (kjax's "
            "margin; first presented as PKPO's; added after the rows were seen)",
            "pass@16",
            "anneal 8->1",
            "k_opt=8",
            ClaimKind.NONINFERIOR,
            margin=0.02,
        ),
    ),
    columns=tuple((f"pass@{k}", f"pass@{k}") for k in KS),
    base=base,
    smoke_arms=("k_opt=8", "anneal 8->1"),
    budget=f"{STEPS} RL steps of {B} prompts x {N} samples (PG) from one 1500-step SFT warm "
    f"start, each arm's learning rate tuned; eval 1000 test problems x 32 samples; "
    f"{tiny_countdown.EXACT_TESTBED}",
    tuning=Tuning(grid=LEARNING_RATES),
)


if __name__ == "__main__":
    sys.exit(table_cli.main(TABLE, default_seeds=10))
