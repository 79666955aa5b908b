"""Label-free RL (TTRL, Zuo et al. 2025) against supervised RL and the warm start's vote.

  python -m experiments.tables.ttrl_table --workdir=DIR [--seeds=10] [--smoke]

TTRL's claims (abstract of arXiv 2504.16084): training on the model's own majority vote
(reward 1 when a sample agrees with the group's plurality answer, no labels) "consistently
improves" pass@1; although supervised only by maj@n, it "surpass[es] the upper limit of
the initial model maj@n"; and it approaches models trained with ground-truth labels.

Design (tiny_arith, CPU; harness.design): one SFT warm start for every seed (1500 steps of
64), then 200 RL steps of 16 prompts x 16 samples (PG, AdamW) with the mean objective
(RLOO) for three arms: supervised (the verifier's labels), TTRL (ObjectiveConfig.reward =
majority_vote: the 16 samples' plurality is the label, ties split; docs/estimators.md
section 6), and TTRL with thresholding (groups whose plurality holds fewer than half of
the 16 samples get no label). Two more arms, supervised and TTRL, start instead from a
strong warm start (5000 SFT steps instead of 1500; the same data and model): from the
1500-step warm start the vote is wrong in most groups (maj@16 0.15), while from the strong
one it is right in most (maj@16 about 0.8), which is the regime TTRL assumes (a base model
whose majority answer is usually right). Claims 8a'-8c' ask 8a-8c again there; they were
added after 8a-8c had run and come out opposite. Every arm trains on the same unlabelled
training prompts and is evaluated on 1000 held-out test problems x 32 samples with the
true labels; unlike the paper, TTRL here does not train on the test prompts themselves
(inductive, not transductive), so the test set measures what the label-free update
learnt in general.

Learning rates: each arm's from {2.5e-4, 5e-4, 1e-3} by experiments.lab.tuning's protocol,
scored on the validation split by the run's eval/objective, which for every arm is the
held-out mean reward under the *true* labels: the label-free arms are tuned with labelled
validation problems, as the paper's hyperparameters were chosen on labelled benchmarks. A
deployment without any labels lacks this, so the TTRL rows are an upper bound on what an
untuned label-free run gets.

Pseudo-label quality: every training step logs, over the step's groups, how often the
plurality label is wrong (pseudo/label_wrong, among the groups that got a label), the
fraction that got one (pseudo/labelled) and the mean |pseudo-reward - true reward|; the
table reports their means over the run and over its first and last 20 steps.

Measured cost (2 CPU cores shared with other jobs): the first three arms, 30 runs plus 18
tuning runs and the 1500-step warm start, took 13.6 min; the two strong-start arms add 20
runs, 12 tuning runs and the 5000-step warm start (docs/tables/ttrl.md has the total).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from experiments.configs import tiny_arith
from experiments.lab import harness, table_cli
from experiments.lab.claims import Claim, ClaimKind
from experiments.lab.harness import Arm
from experiments.lab.tuning import Tuning
from kjax.rl.config import Objective, ObjectiveConfig, RewardSource

STEPS, B, N = 200, 16, 16
LEARNING_RATES = (2.5e-4, 5e-4, 1e-3)
WINDOW = 20  # steps averaged for the first / last pseudo-label error
SUPERVISED, TTRL, TTRL_HALF = "supervised mean (RLOO)", "TTRL mean (RLOO)", "TTRL, agreement >= 0.5"
STRONG_SFT = 5000  # SFT steps of the strong warm start (the table's base: 1500)
STRONG_SUPERVISED, STRONG_TTRL = "strong start: supervised", "strong start: TTRL"


def base(seed: int, smoke: bool):
    cfg = tiny_arith.BASE
    return harness.smoke_base(cfg) if smoke else harness.design(cfg, STEPS, B, N)


def objective(reward: RewardSource, min_agreement: float = 0.0):
    def make(cfg):
        obj = ObjectiveConfig(Objective.MEAN, reward=reward, min_agreement=min_agreement)
        return dataclasses.replace(cfg, objective=obj)

    return make


def strong(make):
    """make, from the strong warm start: STRONG_SFT SFT steps (its own cache beside the
    base warm start's; the smoke budget keeps its few steps)."""

    def strong_make(cfg):
        cfg = make(cfg)
        steps = cfg.sft.steps if cfg.sft.steps < 100 else STRONG_SFT
        sft = dataclasses.replace(cfg.sft, steps=steps, cache_dir=f"{cfg.sft.cache_dir}_strong")
        return dataclasses.replace(cfg, sft=sft)

    return strong_make


def execute(table, arm, seed, run_dir, ctx) -> dict:
    """One RL run (harness.rl_execute) plus the pseudo-label statistics of its steps."""
    from kjax.evaluation import read_jsonl

    out = harness.rl_execute(table, arm, seed, run_dir, ctx)
    steps = [r for r in read_jsonl(run_dir / "run" / "metrics.jsonl") if "pseudo/labelled" in r]
    if not steps:  # the supervised arm logs none
        return out
    for name in ("label_wrong", "labelled", "reward_error"):
        values = np.array([r[f"pseudo/{name}"] for r in steps], float)
        out[f"pseudo/{name}"] = float(np.nanmean(values))
        out[f"pseudo/{name}_first"] = float(np.nanmean(values[:WINDOW]))
        out[f"pseudo/{name}_last"] = float(np.nanmean(values[-WINDOW:]))
    return out


def derive(m: dict) -> dict:
    """Changes from the warm start (its maj@N is the vote TTRL trains on, N = 16)."""
    out = {}
    for key in ("pass@1", "maj@16", "pass@16"):
        if key in m and f"start/{key}" in m:
            out[f"gain/{key}"] = m[key] - m[f"start/{key}"]
    if "pass@1" in m and "start/maj@16" in m:
        out["pass1_minus_start_maj16"] = m["pass@1"] - m["start/maj@16"]
    return out


TABLE = harness.Table(
    name="ttrl_table",
    title="TTRL: label-free majority-vote RL vs supervised RL (tiny_arith)",
    arms=(
        Arm(SUPERVISED, objective(RewardSource.VERIFIER)),
        Arm(TTRL, objective(RewardSource.MAJORITY_VOTE)),
        Arm(TTRL_HALF, objective(RewardSource.MAJORITY_VOTE, 0.5)),
        Arm(STRONG_SUPERVISED, strong(objective(RewardSource.VERIFIER))),
        Arm(STRONG_TTRL, strong(objective(RewardSource.MAJORITY_VOTE))),
    ),
    claims=(
        Claim(
            "8a",
            "label-free RL raises pass@1 over the warm start (Zuo et al. 2025: TTRL "
            "'consistently improves performance')",
            "gain/pass@1",
            TTRL,
            None,
        ),
        Claim(
            "8b",
            "TTRL's pass@1 surpasses the warm start's maj@16, the vote it trains on (Zuo et "
            "al. 2025: 'surpass the upper limit of the initial model maj@n')",
            "pass1_minus_start_maj16",
            TTRL,
            None,
        ),
        Claim(
            "8c",
            "TTRL approaches supervised RL: its pass@1 at most 0.03 below, kjax's margin (Zuo "
            "et al. 2025: 'approach the performance of models trained ... with ground-truth "
            "labels'; they state no margin)",
            "pass@1",
            TTRL,
            SUPERVISED,
            ClaimKind.NONINFERIOR,
            margin=0.03,
        ),
        # 8a'-8c' were added after 8a-8c had run: from the 1500-step warm start the vote is
        # wrong in 84% of the groups at the start and TTRL collapses, so the same claims are
        # asked again from a warm start whose vote is usually right (TTRL's premise).
        *(
            Claim(
                f"{c}'",
                f"{what} (strong warm start, added after 8a-8c)",
                metric,
                STRONG_TTRL,
                base_arm,
                kind,
                margin=margin,
            )  # fmt: skip
            for c, what, metric, base_arm, kind, margin in (
                (
                    "8a",
                    "TTRL raises pass@1 over the warm start",
                    "gain/pass@1",
                    None,
                    ClaimKind.GREATER,
                    0.0,
                ),
                (
                    "8b",
                    "TTRL's pass@1 surpasses the warm start's maj@16",
                    "pass1_minus_start_maj16",
                    None,
                    ClaimKind.GREATER,
                    0.0,
                ),
                (
                    "8c",
                    "TTRL's pass@1 at most 0.03 below supervised RL's (kjax's margin)",
                    "pass@1",
                    STRONG_SUPERVISED,
                    ClaimKind.NONINFERIOR,
                    0.03,
                ),
            )  # fmt: skip
        ),
    ),
    columns=(
        ("pass@1", "pass@1"),
        ("maj@16", "maj@16"),
        ("pass@16", "pass@16"),
        ("warm start pass@1", "start/pass@1"),
        ("warm start maj@16", "start/maj@16"),
        ("pass@1 - warm start maj@16", "pass1_minus_start_maj16"),
        ("label wrong (first 20 steps)", "pseudo/label_wrong_first"),
        ("label wrong (last 20 steps)", "pseudo/label_wrong_last"),
        ("groups labelled", "pseudo/labelled"),
    ),
    base=base,
    smoke_arms=(TTRL,),
    budget=f"{STEPS} RL steps of {B} prompts x {N} samples (PG, mean objective) from one "
    "1500-step SFT warm start, each arm's learning rate tuned on labelled validation "
    "problems (the strong-start arms: a 5000-step warm start); eval 1000 test problems x 32 "
    "samples with the true labels; 2-digit arithmetic (tiny_arith)",
    execute=execute,
    derive=derive,
    tuning=Tuning(grid=LEARNING_RATES),
)


if __name__ == "__main__":
    sys.exit(table_cli.main(TABLE, default_seeds=10))
