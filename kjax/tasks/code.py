"""Competitive programming with stdin/stdout tests: CodeContests or TACO rows from local
JSONL (<manual_dir>/<code_contests|taco>/{train,test}.jsonl, BUILD.md), each completion's
program run on the problem's tests in the bubblewrap sandbox (kjax/rewards/sandbox.py).

The reward is the fraction of tests passed (FRACTION: continuous, Bagirov et al.'s max@k
setting) or 1 only if all pass (ALL: binary, Tang et al.'s pass@k). A hung, crashing or
hostile program fails its tests and scores 0; the runs' outcomes are tallied in the step
metrics (verify/<outcome>), and the run goes on.

A pretrained model gets the problem with the instruction of kjax.data.prompts and answers
with one ```python block. The tiny character model reads the problem text character by
character (printable ASCII): a stand-in that exercises the whole path, not a coder.
"""

from __future__ import annotations

import dataclasses
import enum
import string
from typing import ClassVar

from kjax._fields import check_int, coerce_enums, is_real, need
from kjax.data.formats import CodeFormat
from kjax.tasks.base import CharTokenizer, Problems, TaskConfig, wrap

CHARS = string.printable[:-2]  # printable ASCII, with "\n" and "\t" but no "\r", "\x0b"...


class Reward(enum.Enum):
    FRACTION = "fraction"  # the fraction of tests passed (continuous)
    ALL = "all"  # 1 if every test passes, else 0 (binary)


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    manual_dir: str = ""  # the directory holding <format>/{train,test}.jsonl
    format: CodeFormat = CodeFormat.CODE_CONTESTS
    reward: Reward = Reward.FRACTION
    timeout_s: float = 4.0  # wall-clock limit of one program on one test
    max_tests: int = 0  # the first max_tests tests of a problem count; 0: all of them
    kind: str = dataclasses.field(default="code", init=False)
    sft_targets: ClassVar[bool] = False  # CodeContests/TACO rows keep tests, no programs

    def __post_init__(self):
        super().__post_init__()
        coerce_enums(self, "task.")
        need(
            is_real(self.timeout_s) and self.timeout_s > 0,
            "task.timeout_s",
            "must be > 0",
            self.timeout_s,
        )
        check_int(self.max_tests, "config.task.max_tests", 0)

    def check(self, char_level: bool) -> None:
        need(
            bool(self.manual_dir),
            "task.manual_dir",
            f"is required for code (the directory holding {self.format.value}/train.jsonl "
            "and test.jsonl; BUILD.md says where they come from)",
            "",
        )


def tests_of(example: dict, max_tests: int) -> list[tuple[str, str]]:
    pairs = list(zip(example["inputs"], example["outputs"], strict=True))
    return pairs[:max_tests] if max_tests else pairs


@dataclasses.dataclass(frozen=True)
class Code(Problems):
    config: Config = Config()

    def prompt_ids(self, example: dict) -> list[int]:
        if self.char_level:
            return self.char_ids(_printable(example["problem"]) + "\n")
        from kjax.data import prompts

        return self.chat_ids(prompts.instruction(prompts.Task.CODE, example))

    def target_ids(self, example: dict) -> list[int]:
        raise ValueError(
            "the code task has no reference programs to fine-tune on (CodeContests/TACO rows "
            "keep tests only); set sft.steps=0 or warm-start from a checkpoint."
        )

    def verify(self, completions, examples, pool=None):
        from kjax.rewards import code

        tests = [tests_of(e, self.config.max_tests) for e in examples]
        verdicts = code.verify(completions, tests, timeout_s=self.config.timeout_s, pool=pool)
        return shaped(verdicts, self.config.reward)


def shaped(verdicts, reward: Reward):
    """verdicts with the configured reward: the fraction passed as is, or ALL's 0/1."""
    if reward is Reward.FRACTION:
        return verdicts
    scores = (verdicts.scores == 1.0).astype(verdicts.scores.dtype)
    return dataclasses.replace(verdicts, scores=scores)


def _printable(text: str) -> str:
    """text with characters outside the tiny model's vocabulary replaced by "?"."""
    return "".join(c if c in CHARS else "?" for c in text)


def tiny_tokenizer(cfg: Config) -> CharTokenizer:
    return CharTokenizer(CHARS)


def load(cfg: Config, tokenizer, data_dir, eval_problems: int):
    from kjax.data import builders, loader

    builder = loader.prepare(
        builders.CodeJsonl,
        data_dir,
        config=cfg.format.value,
        manual_dir=cfg.manual_dir,
        needs=("train", "test"),
    )
    return wrap(Code, cfg, builder.as_data_source(), tokenizer, eval_problems, config=cfg)
