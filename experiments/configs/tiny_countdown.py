"""python -m experiments.train --config=experiments/configs/tiny_countdown.py:maxk --workdir=/tmp/tc

The worked example of a task other than arithmetic (docs/tasks.md): Countdown puzzles of
3 numbers in 1..20 with targets in 1..100 (kjax_countdown), read by the same 2-layer,
d=64 character-level Llama as tiny_arith, whose characters now include parentheses,
division and the separators ("3,5,7=56:" -> "(3+5)*7"). SFT warm start on the generator's
solutions (1500 steps of 64), then RL for 300 steps of 16 prompts x 16 samples.

The reward is continuous by default (exact hit 1, a valid expression off by d earns
0.5 * max(0, 1 - d/10)), so max@k differs from pass@k. Presets: mean (RLOO on the
continuous reward), maxk (max@k, k=8, LOO-1), passk (pass@k on the exact-hit reward,
k=8), mean_exact (RLOO on the exact-hit reward).
"""

import dataclasses

from kjax.rl.config import (
    CheckpointConfig,
    CountdownConfig,
    EvalConfig,
    ModelConfig,
    Objective,
    ObjectiveConfig,
    OptimizerConfig,
    PolicyLoss,
    SFTConfig,
    StepConfig,
    TrainConfig,
)
from kjax.tasks.countdown import Reward

BASE = TrainConfig(
    name="tiny_countdown",
    steps=300,
    batch_prompts=16,
    samples=16,
    max_new_tokens=12,  # the longest solution of 3 numbers <= 20 is 10 characters, then eos
    temperature=1.0,
    rl=StepConfig(loss=PolicyLoss.PG),
    optimizer=OptimizerConfig(
        learning_rate=5e-4, warmup_steps=5, total_steps=300, end_lr_ratio=0.1, max_grad_norm=1.0
    ),
    model=ModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=192
    ),
    task=CountdownConfig(count=3, max_number=20, max_target=100, train_size=4000, test_size=200),
    sft=SFTConfig(steps=1500, batch_size=64, learning_rate=3e-3),
    eval=EvalConfig(every=50, n_eval=16, problems=200),
    checkpoint=CheckpointConfig(every=50, keep=2),
)
EXACT = dataclasses.replace(BASE.task, reward=Reward.EXACT)
MAX_AT_K = ObjectiveConfig(Objective.MAX_AT_K, k=8)
# The binary testbed of the pass@k tables (1, 2 and 6): an exact hit scores 1, else 0.
EXACT_BASE = dataclasses.replace(BASE, name="tiny_countdown_exact", task=EXACT)
EXACT_TESTBED = "Countdown (3 numbers <= 20, targets <= 100) with the exact-hit reward"

PRESETS = {
    "mean": dataclasses.replace(BASE, name="tiny_countdown_mean"),
    "maxk": dataclasses.replace(BASE, name="tiny_countdown_maxk", objective=MAX_AT_K),
    "passk": dataclasses.replace(EXACT_BASE, name="tiny_countdown_passk", objective=MAX_AT_K),
    "mean_exact": dataclasses.replace(EXACT_BASE, name="tiny_countdown_mean_exact"),
}


def get_config(preset: str = "maxk") -> TrainConfig:
    return PRESETS[preset]
