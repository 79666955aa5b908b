"""python -m experiments.train --config=experiments/configs/qwen3_8b_math.py:passk \\
    --workdir=/ckpt/q3 --config.model.path=/models/Qwen3-8B-Base \\
    --config.task.manual_dir=/data   # holds math/train.jsonl and math/test.jsonl

Qwen3-8B-Base on MATH with the pass@k objective (k=8, N=16), in the setting of DAPO (Yu et
al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale") where kjax has
the piece: dynamic sampling (groups with all-equal rewards dropped and refilled), no KL
penalty, 16 samples per prompt, learning rate 1e-6 with 10 warm-up steps, weight decay
0.1, PPO clipping at 0.2 over several minibatch updates per rollout, and a length
normalizer that does not weight a sample by 1/its length (CONSTANT_NORMALIZER for DAPO's
token-level mean). Not followed: DAPO's asymmetric clip-higher (0.28) and overlong reward
shaping (kjax has neither), its 512-prompt batches (128 here, one host) and 20k-token
responses (4,096 here). Preset `mean` is the same run on the mean reward (GRPO's target).
kjax reads the model's config.json (model_type qwen3: per-head q/k RMSNorm, head_dim 128
!= 4096/32).
Hardware: one host with 8 GPUs (H100/H200 80+ GB) or a TPU v5p-16 slice; mesh fsdp=8
(x tensor=-1 for the rest), bfloat16. Not run here (parse-tested and mesh-validated only):
no expected numbers are claimed, none are measured; compare the two presets' held-out
pass@1 / pass@8 curves (pass_at_k_vs_step.png).
"""

import dataclasses

from kjax.rl.config import (
    CheckpointConfig,
    DType,
    EvalConfig,
    LossAggregation,
    MathConfig,
    MeshConfig,
    ModelConfig,
    ModelKind,
    Objective,
    ObjectiveConfig,
    OptimizerConfig,
    PolicyLoss,
    StepConfig,
    TrainConfig,
)

PASSK = TrainConfig(
    name="qwen3_8b_math_passk",
    steps=300,
    batch_prompts=128,
    samples=16,
    max_new_tokens=4096,
    temperature=1.0,
    dynamic_sampling=True,
    objective=ObjectiveConfig(Objective.MAX_AT_K, k=8),
    rl=StepConfig(
        loss=PolicyLoss.PPO,
        minibatches=4,
        microbatches=4,
        ppo_epsilon=0.2,
        aggregation=LossAggregation.CONSTANT_NORMALIZER,
    ),
    optimizer=OptimizerConfig(
        learning_rate=1e-6, warmup_steps=10, total_steps=300, weight_decay=0.1
    ),
    model=ModelConfig(kind=ModelKind.HF_DIR, dtype=DType.BFLOAT16),
    task=MathConfig(max_prompt_tokens=512),
    eval=EvalConfig(every=25, n_eval=16, problems=512),
    checkpoint=CheckpointConfig(every=10, keep=3),
    mesh=MeshConfig(data=1, fsdp=8, tensor=-1),
    verifier_workers=16,
)

PRESETS = {
    "passk": PASSK,
    "mean": dataclasses.replace(PASSK, name="qwen3_8b_math_mean", objective=ObjectiveConfig()),
}


def get_config(preset: str = "passk") -> TrainConfig:
    return PRESETS[preset]
