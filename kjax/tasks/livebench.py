"""LiveBench questions (math and reasoning, from a local copy of the public release under
task.manual_dir), scored offline by kjax.inference.livebench. Evaluation only: there is no
training split, so `experiments.evaluate --task=livebench` scores a trained checkpoint,
and a training run on it is refused. Pretrained models only (the questions are natural
language)."""

from __future__ import annotations

import dataclasses

from kjax._fields import need
from kjax.tasks.base import Problems, TaskConfig, no_char_level, with_pool

CATEGORIES = ("math", "reasoning")  # the ones with offline scorers


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    manual_dir: str = ""  # holds <category>/<task>/question.jsonl
    category: str = ""  # "math" or "reasoning"; "": both
    include_removed: bool = False  # also questions LiveBench has since retired
    kind: str = dataclasses.field(default="livebench", init=False)

    def __post_init__(self):
        super().__post_init__()
        need(
            self.category in ("", *CATEGORIES),
            "task.category",
            f"must be one of {', '.join(CATEGORIES)} or empty (both)",
            self.category,
        )

    def check(self, char_level: bool) -> None:
        need(
            False,
            "task.kind",
            "is livebench, an evaluation-only task (no training split); score a trained run "
            "with `python -m experiments.evaluate --workdir=RUN --task=livebench "
            "--task.manual_dir=DIR`",
            self.kind,
        )


def _score_row(item):
    from kjax.inference import livebench
    from kjax.rewards.verdict import NO_ANSWER, REFERENCE_CLASS, PromptVerdict

    completions, row = item
    scores = [livebench.score(row, c) for c in completions]
    # Answer classes: a full-score answer is the reference's; other answers are told apart
    # by their text after the last line break (where the scorers look for the answer).
    seen: dict[str, int] = {}
    ids = []
    for c, s in zip(completions, scores, strict=True):
        tail = c.strip().splitlines()[-1].strip() if c.strip() else ""
        if s >= 1.0:
            ids.append(REFERENCE_CLASS)
        elif not tail:
            ids.append(NO_ANSWER)
        else:
            ids.append(seen.setdefault(tail, len(seen) + 1))
    return PromptVerdict(scores, ids)


@dataclasses.dataclass(frozen=True)
class Livebench(Problems):
    def prompt_ids(self, example: dict) -> list[int]:
        return self.chat_ids(example["question"])

    def target_ids(self, example: dict) -> list[int]:
        raise ValueError("livebench has no reference completions: it is evaluation only.")

    def verify(self, completions, examples, pool=None):
        from kjax.rewards.verdict import stack

        rows = list(zip(completions, examples, strict=True))
        return stack(with_pool(_score_row, rows, completions, pool))


def tiny_tokenizer(cfg: Config):
    no_char_level(cfg.kind)


def load(cfg: Config, tokenizer, data_dir, eval_problems: int):
    from kjax.data import builders, loader
    from kjax.inference import livebench
    from kjax.tasks.base import PROMPT_BUCKET, fit_prompt_len

    need(bool(cfg.manual_dir), "task.manual_dir", "is required for livebench", "")
    name = cfg.category or "offline"
    source = loader.prepare(
        builders.Livebench, data_dir, config=name, manual_dir=cfg.manual_dir
    ).as_data_source()["test"]
    rows = [loader.decode(source[i]) for i in range(len(source))]
    rows = [r for r in rows if livebench.is_scorable(r)]
    if not cfg.include_removed:
        rows = [r for r in rows if not r["removal_date"]]
    need(bool(rows), "task.manual_dir", "holds no scorable LiveBench question", cfg.manual_dir)
    test = rows[:eval_problems]
    task = Livebench(tokenizer, [], test, cfg.max_prompt_tokens, (tokenizer.eos_id,))
    return task if task.prompt_len else fit_prompt_len(task, test, bucket=PROMPT_BUCKET)
