"""The task seen by the trainer: the run's task module (kjax.tasks), loaded for its model.

Each task lives in one module of kjax.tasks (config, data, prompts, SFT targets, verifier;
docs/tasks.md); this module picks it by `cfg.task.kind` and re-exports what the loop uses.
"""

from __future__ import annotations

import pathlib

from kjax import tasks
from kjax.rl.config import ModelKind, TrainConfig
from kjax.tasks.base import (
    CharTokenizer,
    Task,
    decode,
    fit_prompt_len,
    prompt_batch,
    split_validation,
)

__all__ = [
    "CharTokenizer",
    "Task",
    "decode",
    "fit_prompt_len",
    "load_task",
    "prompt_batch",
    "split_validation",
    "tiny_tokenizer",
]


def tiny_tokenizer(cfg: TrainConfig) -> CharTokenizer:
    """The tiny character model's tokenizer: the task's characters."""
    return tasks.module_of(cfg.task.kind).tiny_tokenizer(cfg.task)


def load_task(cfg: TrainConfig, tokenizer, data_dir: str | pathlib.Path) -> Task:
    """Prepares the dataset (once, array_record under data_dir) and wraps it as a Task.

    tokenizer: the pretrained model's, ignored for a TINY model (the task's characters).
    With task.validation_size > 0 the last validation_size train problems become
    task.validation (up to eval.problems of them are kept) and are never trained on."""
    if cfg.model.kind is ModelKind.TINY:
        tokenizer = None
    return tasks.load(cfg.task, tokenizer, data_dir, cfg.eval.problems)
