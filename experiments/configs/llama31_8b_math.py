"""python -m experiments.train --config=experiments/configs/llama31_8b_math.py:passk \\
    --workdir=/ckpt/l8b --config.model.path=/models/Llama-3.1-8B-Instruct \\
    --config.task.manual_dir=/data   # holds math/train.jsonl and math/test.jsonl

Llama-3.1-8B-Instruct on MATH with the pass@k objective (k=8, N=16), PPO with 2 epochs
x 2 minibatches (updates after the first re-weight the max@k advantages off-policy,
exactly, inside the clipped surrogate). Hardware: one host with 8 GPUs (H100/H200
80+ GB) or a TPU v5p-16 slice; mesh fsdp=8 (x tensor=-1 for the rest), bfloat16. Not run
here (parse-tested only), so no expected numbers are claimed; compare the `mean` preset's
held-out pass@1 / pass@8 curves (pass_at_k_vs_step.png) with this one's.
"""

import dataclasses

from kjax.rl.config import (
    CheckpointConfig,
    DType,
    EvalConfig,
    MeshConfig,
    ModelConfig,
    ModelKind,
    Objective,
    ObjectiveConfig,
    OffPolicyMaxAtK,
    OptimizerConfig,
    PolicyLoss,
    RatioLevel,
    StepConfig,
    TaskConfig,
    TaskKind,
    TrainConfig,
)

BASE = TrainConfig(
    name="llama31_8b_math",
    steps=300,
    batch_prompts=128,
    samples=16,
    max_new_tokens=1024,
    temperature=1.0,
    dynamic_sampling=True,
    objective=ObjectiveConfig(Objective.MAX_AT_K, k=8),
    rl=StepConfig(
        loss=PolicyLoss.PPO,
        epochs=2,
        minibatches=2,
        microbatches=8,
        tis_cap=2.0,
        ratio_level=RatioLevel.SEQUENCE,  # the exact off-policy update needs it
        offpolicy_max_at_k=OffPolicyMaxAtK.EXACT,
    ),
    optimizer=OptimizerConfig(
        learning_rate=1e-6, warmup_steps=10, total_steps=300, weight_decay=0.01
    ),
    model=ModelConfig(kind=ModelKind.HF_DIR, dtype=DType.BFLOAT16),
    task=TaskConfig(kind=TaskKind.MATH, max_prompt_tokens=512),
    eval=EvalConfig(every=25, n_eval=16, problems=512),
    checkpoint=CheckpointConfig(every=10, keep=3),
    mesh=MeshConfig(data=1, fsdp=8, tensor=-1),
    verifier_workers=16,
)

PRESETS = {
    "passk": BASE,
    "mean": dataclasses.replace(
        BASE,
        name="llama31_8b_math_mean",
        objective=ObjectiveConfig(),
        rl=dataclasses.replace(BASE.rl, offpolicy_max_at_k=OffPolicyMaxAtK.OFF),
    ),
}


def get_config(preset: str = "passk") -> TrainConfig:
    return PRESETS[preset]
