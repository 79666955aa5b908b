"""Table 7 reworked (issue 47), a SKETCH not yet run: does Tang et al.'s pair hold on the
real SmolLM2-135M-Instruct, trained with LoRA: the pass@k objective (k = 8) against the
mean objective, "raises pass@k" and "lowers pass@1"?

  python -m experiments.tables.smollm2_lora_passk --workdir=DIR [--seeds=S] [--smoke]

The claims below were written before any run of this module. Provisional budget (to be
fixed by the pilot, so that the minimum detectable effect on pass@8 is <= 0.03 at 80%
power; experiments.lab's power tool reads the pilot's rows): the smollm2_arith task
(chat-templated +/- arithmetic answered in \\boxed{}, here 2-digit; no SFT), rank-16 LoRA on
every projection (alpha 32) over the frozen base, STEPS RL steps of B prompts x N samples
(PG), each arm's learning rate from LEARNING_RATES by experiments.lab.tuning's protocol
(tuning seeds 1000-1001 on the validation split), evaluation on PROBLEMS held-out problems
x N_EVAL samples (unbiased pass@1 and pass@8: n >= 2k). Nothing here is measured yet: the
only figure is the pilot step time in the issue's closing note, on a loaded CPU.

--smoke: the same arms on the tiny random character model (2 steps), end to end.
"""

from __future__ import annotations

import dataclasses
import sys

from experiments.configs import smollm2_arith, tiny_arith
from experiments.lab import harness, table_cli
from experiments.lab.claims import Claim, ClaimKind
from experiments.lab.harness import Arm
from experiments.lab.tuning import Tuning
from experiments.tables.tang2025_table import CODE
from kjax.rl.config import LoraConfig, MaxAtKEstimator, Objective, ObjectiveConfig

STEPS, B, N, K = 40, 4, 16, 8
PROBLEMS, N_EVAL = 200, 16
LEARNING_RATES = (2e-5, 5e-5, 1e-4)
LORA = LoraConfig(rank=16, alpha=32.0)
MEAN, PASSK = "mean (RLOO)", f"pass@k (k={K}, LOO-1)"


def base(seed: int, smoke: bool):
    if smoke:
        return harness.smoke_base(tiny_arith.BASE)
    cfg = harness.budget(smollm2_arith.BASE, STEPS, B, N)
    # 2-digit problems: 1-digit +/- has only 200 distinct ones, too few to hold out.
    task = dataclasses.replace(
        cfg.task, digits=2, train_size=4000, test_size=PROBLEMS, validation_size=PROBLEMS
    )
    ev = dataclasses.replace(cfg.eval, problems=PROBLEMS, n_eval=N_EVAL)
    model = dataclasses.replace(cfg.model, lora=LORA)
    return dataclasses.replace(cfg, task=task, eval=ev, model=model)


def objective(kind: Objective):
    """make(cfg): cfg with MEAN (RLOO) or MAX_AT_K at k = K (N/2 in smoke runs), PKPO's
    leave-one-out-minus-one estimator."""

    def make(cfg):
        if kind is Objective.MEAN:
            return dataclasses.replace(cfg, objective=ObjectiveConfig(kind))
        k = min(K, cfg.samples // 2)
        est = MaxAtKEstimator.LOO_MINUS_ONE
        obj = ObjectiveConfig(kind, k=k, max_at_k_estimator=est)
        return dataclasses.replace(cfg, objective=obj)

    return make


TABLE = harness.Table(
    name="smollm2_lora_passk",
    title="SmolLM2-135M-Instruct with LoRA: mean vs pass@k objective (k = 8)",
    arms=(Arm(MEAN, objective(Objective.MEAN)), Arm(PASSK, objective(Objective.MAX_AT_K))),
    claims=(
        Claim(
            "7a",
            f"the pass@k objective raises pass@k over the mean objective ({CODE}: pass@10 "
            "35.1 -> 41.7)",
            "pass@8",
            PASSK,
            MEAN,
        ),
        Claim(
            "7b",
            f"... and lowers pass@1 ({CODE}, PG: 26.2 -> 20.6)",
            "pass@1",
            PASSK,
            MEAN,
            ClaimKind.LESS,
        ),
    ),
    columns=(("pass@1", "pass@1"), ("pass@8", "pass@8")),
    base=base,
    budget=(
        f"PROVISIONAL: {STEPS} RL steps of {B} prompts x {N} samples (PG, LoRA r16 on the "
        f"frozen base, no SFT), lr from {LEARNING_RATES}; eval {PROBLEMS} problems x {N_EVAL}"
    ),
    tuning=Tuning(grid=LEARNING_RATES),
)


if __name__ == "__main__":
    sys.exit(table_cli.main(TABLE, default_seeds=1))
