"""Generated integer arithmetic ("What is 38 + 7?"): the tiny model's task and the
quickstart's. The tiny model reads "38+7=" character by character and answers "45<eos>";
a pretrained model gets a chat instruction and answers in \\boxed{}."""

from __future__ import annotations

import dataclasses

from kjax._fields import check_int, coerce_enum, need
from kjax.data.synthetic import Operator
from kjax.tasks.base import CharTokenizer, Problems, TaskConfig, with_pool, wrap

CHARS = "0123456789+-*= "


def operators(value) -> tuple[Operator, ...]:
    """A tuple of Operator from members, or a comma-separated string of names or symbols
    ("add,sub" or "+,-", as the command line gives them)."""
    items = value.split(",") if isinstance(value, str) else value
    ops = tuple(
        coerce_enum(v.strip() if isinstance(v, str) else v, Operator, "config.task.operators")
        for v in items
    )
    need(bool(ops), "task.operators", "must name at least one operator (e.g. add,sub)", value)
    need(len(set(ops)) == len(ops), "task.operators", "repeats an operator", value)
    return ops


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    digits: int = 2  # each operand has 1..digits digits
    operands: int = 2
    operators: tuple[Operator, ...] = (Operator.ADD, Operator.SUB)
    train_size: int = 4000
    test_size: int = 200
    data_seed: int = 0
    kind: str = dataclasses.field(default="arith", init=False)

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "operators", operators(self.operators))
        check_int(self.digits, "config.task.digits", 1)
        check_int(self.operands, "config.task.operands", 2)
        check_int(self.train_size, "config.task.train_size", 1)
        check_int(self.test_size, "config.task.test_size", 1)
        check_int(self.data_seed, "config.task.data_seed", 0)
        need(
            self.validation_size < self.train_size,
            "task.validation_size",
            f"must be below task.train_size={self.train_size} (some problems must train)",
            self.validation_size,
        )


def _verify_row(item):
    from kjax.rewards import arith

    return arith.verify_prompt(*item)


class Arith(Problems):
    def prompt_ids(self, example: dict) -> list[int]:
        if self.char_level:
            expr = example["question"].removeprefix("What is ").rstrip("?").replace(" ", "")
            return self.char_ids(expr + "=")
        from kjax.data import prompts

        return self.chat_ids(prompts.instruction(prompts.Task.ARITH, example))

    def target_ids(self, example: dict) -> list[int]:
        answer = example["answer"]
        return self.stop_after(
            str(answer) if self.char_level else f"The answer is \\boxed{{{answer}}}."
        )

    def verify(self, completions, examples, pool=None):
        from kjax.rewards.verdict import stack

        rows = list(zip(completions, [e["answer"] for e in examples], strict=True))
        return stack(with_pool(_verify_row, rows, completions, pool))


def tiny_tokenizer(cfg: Config) -> CharTokenizer:
    return CharTokenizer(CHARS)


def load(cfg: Config, tokenizer, data_dir, eval_problems: int):
    from kjax.data import builders, loader, synthetic

    spec = synthetic.ArithSpec(digits=cfg.digits, operands=cfg.operands, operators=cfg.operators)
    letters = "".join({"ADD": "p", "SUB": "s", "MUL": "m"}[op.name] for op in cfg.operators)
    name = f"d{cfg.digits}o{cfg.operands}{letters}n{cfg.train_size}t{cfg.test_size}s{cfg.data_seed}"
    bcfg = builders.ArithConfig(
        name=name, spec=spec, train_size=cfg.train_size, test_size=cfg.test_size, seed=cfg.data_seed
    )
    source = loader.prepare(builders.KjaxArith, data_dir, config=bcfg).as_data_source()
    # bos, operands, operators and "=": the exact bound, so the tiny model never refits.
    char_prompt_len = 1 + cfg.operands * (cfg.digits + 1)
    return wrap(Arith, cfg, source, tokenizer, eval_problems, char_prompt_len)
