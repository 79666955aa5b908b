"""python -m experiments.train --config=experiments/configs/llama31_8b_math.py:passk \\
    --workdir=/ckpt/l8b --config.model.path=/models/Llama-3.1-8B-Instruct \\
    --config.task.manual_dir=/data   # holds math/train.jsonl and math/test.jsonl

Llama-3.1-8B-Instruct on MATH with the pass@k objective (k=8, N=16), PPO with 2 epochs
x 2 minibatches (updates after the first re-weight the max@k advantages off-policy,
exactly, inside the clipped surrogate). Hardware: one host with 8 GPUs (H100/H200
80+ GB) or a TPU v5p-16 slice; mesh fsdp=8 (x tensor=-1 for the rest), bfloat16; on a
v5e-256 slice fsdp 32 x tensor 8 with 2 microbatches (SLICE_LAYOUTS, below). Not run
here (parse-tested only), so no expected numbers are claimed; compare the `mean` preset's
held-out pass@1 / pass@8 curves (pass_at_k_vs_step.png) with this one's.

Preset `codecontests`: Tang et al. 2025's code setting, pass@k (k=8) on CodeContests with
the binary all-tests-pass reward, programs run in the sandbox by 32 verifier workers
(--config.task.manual_dir holds code_contests/{train,test}.jsonl); --config.task.reward=
fraction gives Bagirov et al.'s continuous max@k reward instead.

Preset `nemo_rl`: NeMo-RL's published Llama-3.1-8B GRPO performance configuration as far
as kjax can match it (NeMo-RL's performance summary, v0.5 H100 BF16 table: on-policy
GRPO, 64 prompts x 32 generations = 2,048 samples per step, training global batch 512
(4 optimizer steps per RL step), maximum total sequence length 4,096 on OpenMathInstruct-2).
Here: the group z-score baseline (GRPO), the clipped PPO loss for 1 epoch x 4 minibatches
(old log-probs from one forward, as NeMo-RL's "policy logprobs" stage), no KL term, no
dynamic sampling, prompts of up to 512 tokens and completions of up to 3,584 (512 + 3,584
= 4,096), kjax's MATH task standing in for OpenMathInstruct-2; mesh tensor 8 per group of
8 GPUs. For experiments.plan_scale's NeMo-RL row (docs/scale.md), not a training recipe.
"""

import dataclasses

from kjax.rl.config import (
    CheckpointConfig,
    CodeConfig,
    DType,
    EvalConfig,
    MathConfig,
    MeanBaseline,
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
    TrainConfig,
)
from kjax.tasks.code import Reward

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
    task=MathConfig(max_prompt_tokens=512),
    eval=EvalConfig(every=25, n_eval=16, problems=512),
    checkpoint=CheckpointConfig(every=10, keep=3),
    mesh=MeshConfig(data=1, fsdp=8, tensor=-1),
    verifier_workers=16,
)

CODE = dataclasses.replace(
    BASE,
    name="llama31_8b_codecontests",
    max_new_tokens=2048,
    task=CodeConfig(reward=Reward.ALL, timeout_s=4.0, max_tests=20, max_prompt_tokens=1536),
    eval=dataclasses.replace(BASE.eval, problems=256),
    verifier_workers=32,
)

NEMO_RL = dataclasses.replace(
    BASE,
    name="llama31_8b_math_nemo_rl",
    batch_prompts=64,
    samples=32,
    max_new_tokens=3584,
    dynamic_sampling=False,
    objective=ObjectiveConfig(mean_baseline=MeanBaseline.GROUP_ZSCORE),
    rl=StepConfig(loss=PolicyLoss.PPO, epochs=1, minibatches=4, microbatches=8),
    mesh=MeshConfig(data=-1, fsdp=1, tensor=8),
)

# The mesh and microbatches per slice (chip kind, chips) where config.mesh's rule is not
# the fastest compiled (experiments/slices.py; plan_scale and the trainer use them when
# no mesh is given). v5e-256: 1x32x8 x 2 met the 35% update MFU goal (36.9% with no
# overlap, RL step 8.1 s), where the rule's 1x8x32 x 8 is ICI-bound on tensor 32 (29.0%
# overlapped, 14.1% with no overlap; docs/scale.md, compiled, not run).
_V5E_256 = (MeshConfig(data=1, fsdp=32, tensor=8), 2)
SLICE_LAYOUTS = {"passk": {("v5e", 256): _V5E_256}, "mean": {("v5e", 256): _V5E_256}}

PRESETS = {
    "passk": BASE,
    "codecontests": CODE,
    "nemo_rl": NEMO_RL,
    "mean": dataclasses.replace(
        BASE,
        name="llama31_8b_math_mean",
        objective=ObjectiveConfig(),
        rl=dataclasses.replace(BASE.rl, offpolicy_max_at_k=OffPolicyMaxAtK.OFF),
    ),
}


def get_config(preset: str = "passk") -> TrainConfig:
    return PRESETS[preset]
