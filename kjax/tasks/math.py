"""MATH-format problems from local JSONL (<manual_dir>/math/{train,test}.jsonl), answers
checked by math-verify; pretrained models only."""

from __future__ import annotations

import dataclasses

from kjax._fields import need
from kjax.tasks.base import Problems, TaskConfig, no_char_level, wrap


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    manual_dir: str = ""  # the directory holding math/{train,test}.jsonl
    kind: str = dataclasses.field(default="math", init=False)

    def check(self, char_level: bool) -> None:
        need(
            bool(self.manual_dir),
            "task.manual_dir",
            "is required for MATH (the directory holding math/train.jsonl and math/test.jsonl)",
            "",
        )
        if char_level:
            no_char_level(self.kind)


class Math(Problems):
    def prompt_ids(self, example: dict) -> list[int]:
        from kjax.data import prompts

        return self.chat_ids(prompts.instruction(prompts.Task.MATH, example))

    def target_ids(self, example: dict) -> list[int]:
        return self.stop_after(f"The answer is \\boxed{{{example['answer']}}}.")

    def verify(self, completions, examples, pool=None):
        from kjax.rewards import math as math_rewards  # math-verify is slow to import

        return math_rewards.verify(completions, [e["answer"] for e in examples], pool=pool)


def tiny_tokenizer(cfg: Config):
    no_char_level(cfg.kind)


def load(cfg: Config, tokenizer, data_dir, eval_problems: int):
    from kjax.data import builders, loader

    source = loader.prepare(
        builders.MathJsonl,
        data_dir,
        config="math",
        manual_dir=cfg.manual_dir,
        needs=("train", "test"),
    )
    return wrap(Math, cfg, source.as_data_source(), tokenizer, eval_problems)
