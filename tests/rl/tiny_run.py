"""python -m experiments.train --config=tests/rl/tiny_run.py:tiny --workdir=DIR

A seconds-long tiny_arith run for the loop, resume and multi-host tests (no SFT): a
1-layer d=32 character Llama, 8 prompts x 4 samples, checkpoints every 3 steps.
"""

import dataclasses

from kjax.rl.config import (
    ArithConfig,
    CheckpointConfig,
    EvalConfig,
    ModelConfig,
    Objective,
    ObjectiveConfig,
    Operator,
    OptimizerConfig,
    SFTConfig,
    StepConfig,
    TrainConfig,
)

TINY = TrainConfig(
    name="tiny_run",
    steps=12,
    batch_prompts=8,
    samples=4,
    max_new_tokens=4,
    objective=ObjectiveConfig(Objective.MAX_AT_K, k=2),
    rl=StepConfig(microbatches=2),
    optimizer=OptimizerConfig(learning_rate=3e-3, total_steps=40),
    model=ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    ),
    task=ArithConfig(
        digits=1, operands=2, operators=(Operator.ADD, Operator.SUB), train_size=150, test_size=8
    ),
    sft=SFTConfig(steps=0),
    eval=EvalConfig(every=6, n_eval=4, problems=8),
    checkpoint=CheckpointConfig(every=3, keep=2),
)

PRESETS = {
    "tiny": TINY,
    "tiny_sft": dataclasses.replace(TINY, sft=SFTConfig(steps=4, batch_size=8)),
}


def get_config(preset: str = "tiny") -> TrainConfig:
    return PRESETS[preset]
