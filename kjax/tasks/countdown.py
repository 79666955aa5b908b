"""Countdown (generated): combine the given numbers, each once, with + - * / and
parentheses to reach the target. The reward is continuous by default: an exact hit scores
1 and a valid expression off by d scores near_miss_weight * max(0, 1 - d / near_miss_range)
(kjax/rewards/countdown.py), so max@k and pass@k differ; reward=EXACT makes it binary.

The tiny model reads "3,5,7=56:" (numbers, "=", target, ":") character by character and
answers with an expression, "(3+5)*7<eos>"; a pretrained model gets a chat instruction and
answers inside <answer></answer>. SFT targets are the generator's own solutions.
"""

from __future__ import annotations

import dataclasses
import enum

from kjax._fields import check_int, coerce_enums, is_real, need
from kjax.tasks.base import CharTokenizer, Problems, TaskConfig, with_pool, wrap

CHARS = "0123456789+-*/(),=:"


class Reward(enum.Enum):
    NEAR_MISS = "near_miss"  # continuous: exact hit 1, near misses partial credit (max@k)
    EXACT = "exact"  # binary: exact hit 1, else 0 (pass@k)


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    count: int = 3  # numbers per puzzle
    max_number: int = 20  # numbers are drawn from 1..max_number
    max_target: int = 100  # targets lie in 1..max_target
    train_size: int = 4000
    test_size: int = 200
    data_seed: int = 0
    reward: Reward = Reward.NEAR_MISS
    near_miss_weight: float = 0.5  # the most a near miss earns, in [0, 1)
    near_miss_range: float = 10.0  # a miss by this much or more earns 0
    kind: str = dataclasses.field(default="countdown", init=False)

    def __post_init__(self):
        super().__post_init__()
        coerce_enums(self, "task.")
        check_int(self.count, "config.task.count", 2)
        check_int(self.max_number, "config.task.max_number", 1)
        check_int(self.max_target, "config.task.max_target", 1)
        check_int(self.train_size, "config.task.train_size", 1)
        check_int(self.test_size, "config.task.test_size", 1)
        check_int(self.data_seed, "config.task.data_seed", 0)
        w, r = self.near_miss_weight, self.near_miss_range
        need(
            is_real(w) and 0 <= w < 1,
            "task.near_miss_weight",
            "must be in [0, 1) so an exact hit beats a near miss",
            w,
        )
        need(is_real(r) and r > 0, "task.near_miss_range", "must be > 0", r)
        need(
            self.validation_size < self.train_size,
            "task.validation_size",
            f"must be below task.train_size={self.train_size} (some problems must train)",
            self.validation_size,
        )

    def reward_shape(self):
        """The verifier's kjax.rewards.countdown.CountdownReward for this config."""
        from kjax.rewards.countdown import CountdownReward

        weight = self.near_miss_weight if self.reward is Reward.NEAR_MISS else 0.0
        return CountdownReward(near_miss_weight=weight, near_miss_range=self.near_miss_range)


def _verify_row(item):
    from kjax.rewards import countdown

    completions, numbers, target, reward = item
    return countdown.verify_prompt(completions, numbers, target, reward)


@dataclasses.dataclass(frozen=True)
class Countdown(Problems):
    reward: object = None  # kjax.rewards.countdown.CountdownReward

    def prompt_ids(self, example: dict) -> list[int]:
        numbers, target = [int(n) for n in example["numbers"]], int(example["target"])
        if self.char_level:
            return self.char_ids(",".join(map(str, numbers)) + f"={target}:")
        from kjax.data import prompts

        return self.chat_ids(prompts.instruction(prompts.Task.COUNTDOWN, example))

    def target_ids(self, example: dict) -> list[int]:
        solution = example["solution"]
        return self.stop_after(solution if self.char_level else f"<answer>{solution}</answer>")

    def verify(self, completions, examples, pool=None):
        from kjax.rewards.verdict import stack

        rows = [
            (c, [int(n) for n in e["numbers"]], int(e["target"]), self.reward)
            for c, e in zip(completions, examples, strict=True)
        ]
        return stack(with_pool(_verify_row, rows, completions, pool))


def tiny_tokenizer(cfg: Config) -> CharTokenizer:
    return CharTokenizer(CHARS)


def char_prompt_len(cfg: Config) -> int:
    """The tiny model's exact prompt bound: bos, the numbers and commas, "=", target, ":"."""
    return (
        1 + cfg.count * len(str(cfg.max_number)) + cfg.count - 1 + 1 + len(str(cfg.max_target)) + 1
    )


def load(cfg: Config, tokenizer, data_dir, eval_problems: int):
    from kjax.data import builders, loader, synthetic

    spec = synthetic.CountdownSpec(
        count=cfg.count, max_number=cfg.max_number, max_target=cfg.max_target
    )
    sizes = f"n{cfg.train_size}t{cfg.test_size}s{cfg.data_seed}"
    name = f"c{cfg.count}m{cfg.max_number}t{cfg.max_target}{sizes}"
    bcfg = builders.CountdownConfig(
        name=name, spec=spec, train_size=cfg.train_size, test_size=cfg.test_size, seed=cfg.data_seed
    )
    source = loader.prepare(builders.KjaxCountdown, data_dir, config=bcfg).as_data_source()
    return wrap(
        Countdown,
        cfg,
        source,
        tokenizer,
        eval_problems,
        char_prompt_len(cfg),
        reward=cfg.reward_shape(),
    )
