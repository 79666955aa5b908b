"""python -m experiments.train --config=experiments/configs/qwen25_math_7b.py:drgrpo \\
    --workdir=/ckpt/q7b --config.model.path=/models/Qwen2.5-Math-7B \\
    --config.task.manual_dir=/data   # holds math/train.jsonl and math/test.jsonl

Qwen2.5-Math-7B (base) on MATH in the setting of Dr. GRPO (Liu et al. 2025, "Understanding
R1-Zero-Like Training: A Critical Perspective"): 128 prompts x 8 samples per step, learning
rate 1e-6, temperature 1.0, no KL penalty, up to 3,000 new tokens, and their unbiased
loss: the group-mean baseline without the std division (GROUP_MEAN) and a constant length
normalizer (CONSTANT_NORMALIZER). Preset `passk` keeps that budget and optimizes pass@4
instead (max@k with the LOO_MINUS_ONE estimator). kjax reads the model's config.json
(model_type qwen2: q/k/v biases; use_sliding_window is false, so no window), and the
prompt plus completion stay within its 4,096 positions.
Hardware: one host with 8 GPUs (H100/H200 80+ GB) or a TPU v5p-16 slice; mesh fsdp=8
(x tensor=-1 for the rest), bfloat16. Not run here (parse-tested and mesh-validated only):
no expected numbers are claimed, none are measured. Liu et al. report their 7B model's
average over five math benchmarks; compare this run's held-out pass@1 / pass@4 curves
(pass_at_k_vs_step.png) between the two presets rather than against their figures.
"""

import dataclasses

from kjax.rl.config import (
    CheckpointConfig,
    DType,
    EvalConfig,
    LossAggregation,
    MathConfig,
    MeanBaseline,
    MeshConfig,
    ModelConfig,
    ModelKind,
    Objective,
    ObjectiveConfig,
    OptimizerConfig,
    StepConfig,
    TrainConfig,
)

DRGRPO = TrainConfig(
    name="qwen25_math_7b_drgrpo",
    steps=400,
    batch_prompts=128,
    samples=8,
    max_new_tokens=3000,
    temperature=1.0,
    objective=ObjectiveConfig(Objective.MEAN, mean_baseline=MeanBaseline.GROUP_MEAN),
    rl=StepConfig(aggregation=LossAggregation.CONSTANT_NORMALIZER, microbatches=16),
    optimizer=OptimizerConfig(learning_rate=1e-6, total_steps=400),
    model=ModelConfig(kind=ModelKind.HF_DIR, dtype=DType.BFLOAT16),
    task=MathConfig(max_prompt_tokens=512),
    eval=EvalConfig(every=25, n_eval=16, problems=512),
    checkpoint=CheckpointConfig(every=10, keep=3),
    mesh=MeshConfig(data=1, fsdp=8, tensor=-1),
    verifier_workers=16,
)

PRESETS = {
    "drgrpo": DRGRPO,
    "passk": dataclasses.replace(
        DRGRPO,
        name="qwen25_math_7b_passk",
        objective=ObjectiveConfig(Objective.MAX_AT_K, k=4),
    ),
}


def get_config(preset: str = "drgrpo") -> TrainConfig:
    return PRESETS[preset]
