"""The task seen by the trainer: problems as token ids, SFT targets, and the verifier.

`Task` is a small protocol; each TaskKind has one implementation, chosen in `TASKS`. A
TINY model reads arithmetic character by character ("12+7=" -> "19<eos>"); pretrained
models get the chat-templated instruction of kjax.data.prompts and answer in \\boxed{}.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from collections.abc import Sequence
from typing import ClassVar, Protocol

import numpy as np

from kjax.data import builders, loader, prompts, synthetic
from kjax.rewards import arith
from kjax.rewards.verdict import NO_ANSWER, PromptVerdict, Verdicts, stack
from kjax.rl.config import ModelKind, TaskConfig, TaskKind, TrainConfig

# A pretrained model's default prompt width S is the longest prompt of the dataset rounded
# up to this: compute follows the real prompt length (an arith chat prompt of SmolLM2 has
# 49 tokens: S = 64), and S is fixed for the run, so nothing retraces.
_PROMPT_BUCKET = 16


class CharTokenizer:
    """Characters of arithmetic: 0 pad, 1 bos, 2 eos, then digits and operators."""

    CHARS = "0123456789+-*= "
    pad_id, bos_id, eos_id = 0, 1, 2
    vocab_size = 3 + len(CHARS)

    def encode(self, text: str) -> list[int]:
        unknown = set(text) - set(self.CHARS)
        if unknown:
            raise ValueError(f"CharTokenizer cannot encode {sorted(unknown)} in {text!r}.")
        return [3 + self.CHARS.index(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            if int(i) == self.eos_id:
                break
            if 3 <= int(i) < self.vocab_size:  # ids past the vocabulary (bench models) drop
                out.append(self.CHARS[int(i) - 3])
        return "".join(out)


class Task(Protocol):
    """Problems of one split and how to score completions of them.

    tokenizer: CharTokenizer or kjax.tokenizer.Tokenizer. prompt_len: S, prompts left-pad
    to it. stop_ids: tokens that end a completion.
    """

    tokenizer: object
    train: Sequence[dict]
    test: Sequence[dict]
    prompt_len: int
    stop_ids: tuple[int, ...]
    validation: Sequence[dict]  # held out of train (task.validation_size), for tuning

    def prompt_ids(self, example: dict) -> list[int]: ...

    def target_ids(self, example: dict) -> list[int]:
        """The SFT completion: the answer, then the stop token."""
        ...

    def verify(self, completions: list[list[str]], examples: Sequence[dict], pool=None) -> Verdicts:
        """[B][N] completion strings -> [B, N] verdicts; `pool` (kjax.rewards.pool) verifies
        prompts in parallel, a prompt that times out scores 0 with no answers."""
        ...


@dataclasses.dataclass(frozen=True)
class _Problems:
    """What every task shares: the splits and the prompt / answer encoding."""

    PROMPT: ClassVar[prompts.Task]
    tokenizer: object
    train: Sequence[dict]
    test: Sequence[dict]
    prompt_len: int
    stop_ids: tuple[int, ...]
    validation: Sequence[dict] = ()

    def prompt_ids(self, example: dict) -> list[int]:
        if isinstance(self.tokenizer, CharTokenizer):
            expr = example["question"].removeprefix("What is ").rstrip("?").replace(" ", "")
            return [CharTokenizer.bos_id] + self.tokenizer.encode(expr + "=")
        message = {"role": "user", "content": prompts.instruction(self.PROMPT, example)}
        return self.tokenizer.encode_chat([message])

    def target_ids(self, example: dict) -> list[int]:
        answer = example["answer"]
        char_level = isinstance(self.tokenizer, CharTokenizer)
        text = str(answer) if char_level else f"The answer is \\boxed{{{answer}}}."
        return self.tokenizer.encode(text) + [self.stop_ids[0]]


def _timed_out(n: int) -> PromptVerdict:
    return PromptVerdict([0.0] * n, [NO_ANSWER] * n)


def _arith_row(item) -> PromptVerdict:
    return arith.verify_prompt(*item)


class ArithTask(_Problems):
    PROMPT = prompts.Task.ARITH

    def verify(self, completions, examples, pool=None) -> Verdicts:
        refs = [e["answer"] for e in examples]
        if pool is None:
            return arith.verify(completions, refs)
        rows = pool.map(_arith_row, list(zip(completions, refs, strict=True)), default=None)
        return stack(
            [_timed_out(len(c)) if r is None else r for r, c in zip(rows, completions, strict=True)]
        )


class MathTask(_Problems):
    PROMPT = prompts.Task.MATH

    def verify(self, completions, examples, pool=None) -> Verdicts:
        from kjax.rewards import math as math_rewards  # math-verify is slow to import

        return math_rewards.verify(completions, [e["answer"] for e in examples], pool=pool)


def _arith_builder(t: TaskConfig, data_dir):
    spec = synthetic.ArithSpec(digits=t.digits, operands=t.operands, operators=t.operators)
    letters = "".join({"+": "p", "-": "s", "*": "m"}[op.value] for op in t.operators)
    name = f"d{t.digits}o{t.operands}{letters}n{t.train_size}t{t.test_size}s{t.data_seed}"
    bcfg = builders.ArithConfig(
        name=name, spec=spec, train_size=t.train_size, test_size=t.test_size, seed=t.data_seed
    )
    return loader.prepare(builders.KjaxArith, data_dir, config=bcfg)


def _math_builder(t: TaskConfig, data_dir):
    return loader.prepare(builders.MathJsonl, data_dir, config="math", manual_dir=t.manual_dir)


# TaskKind -> (implementation, dataset preparation).
TASKS = {
    TaskKind.ARITH: (ArithTask, _arith_builder),
    TaskKind.MATH: (MathTask, _math_builder),
}


def prompt_batch(task: Task, examples: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded (prompts [B,S] int32, mask [B,S] bool), S = task.prompt_len (no retrace)."""
    ids = [task.prompt_ids(e) for e in examples]
    S = task.prompt_len
    longest = max(len(i) for i in ids)
    if longest > S:
        raise ValueError(f"a prompt has {longest} tokens > task.max_prompt_tokens={S}; raise it.")
    tokens = np.zeros((len(ids), S), np.int32)
    mask = np.zeros((len(ids), S), bool)
    for row, seq in enumerate(ids):
        tokens[row, S - len(seq) :] = seq
        mask[row, S - len(seq) :] = True
    return tokens, mask


def decode(task: Task, tokens: np.ndarray, mask: np.ndarray) -> list[list[str]]:
    """Completions [B,N,T] -> [B][N] strings (masked tokens only)."""
    B, N, _ = tokens.shape
    return [[task.tokenizer.decode(tokens[b, i][mask[b, i]]) for i in range(N)] for b in range(B)]


class _Head:
    """The first `size` records of a random-access source (len and [i]), e.g. the train
    split without the validation problems at its end."""

    def __init__(self, source, size: int):
        self._source, self._size = source, size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, i: int):
        if not -self._size <= i < self._size:
            raise IndexError(f"record {i} of {self._size}")
        return self._source[i % self._size]


def split_validation(train, size: int, problems: int) -> tuple[object, list[dict]]:
    """(train without its last `size` records, the first `problems` of those, decoded)."""
    if size == 0:
        return train, []
    if size >= len(train):
        raise ValueError(
            f"task.validation_size={size} must be below the train split's {len(train)} "
            "problems (some must train); lower it."
        )
    rest = len(train) - size
    return _Head(train, rest), [loader.decode(train[rest + i]) for i in range(min(size, problems))]


def load_task(cfg: TrainConfig, tokenizer, data_dir: str | pathlib.Path) -> Task:
    """Prepares the dataset (once, array_record under data_dir) and wraps it as a Task.

    With task.validation_size > 0 the last validation_size train problems become
    task.validation (up to eval.problems of them are kept) and are never trained on."""
    t = cfg.task
    implementation, prepare = TASKS[t.kind]
    source = prepare(t, data_dir).as_data_source()
    size = min(len(source["test"]), cfg.eval.problems)
    test = [loader.decode(source["test"][i]) for i in range(size)]
    train, validation = split_validation(source["train"], t.validation_size, cfg.eval.problems)
    if cfg.model.kind is ModelKind.TINY:
        tokenizer = CharTokenizer()
        prompt_len = 1 + t.operands * (t.digits + 1)  # bos, operands, operators and "="
        stop = (CharTokenizer.eos_id,)
    else:
        prompt_len, stop = 0, (tokenizer.eos_id,)
    task = implementation(
        tokenizer, train, test, t.max_prompt_tokens or prompt_len, stop, validation
    )
    if task.prompt_len:
        return task
    every = (loader.decode(source["train"][i]) for i in range(len(source["train"])))
    return fit_prompt_len(task, itertools.chain(every, test), bucket=_PROMPT_BUCKET)


def fit_prompt_len(task: Task, examples, bucket: int = 1) -> Task:
    """task with prompt_len = its longest prompt over examples, rounded up to `bucket`."""
    longest = max(len(task.prompt_ids(e)) for e in examples)
    return dataclasses.replace(task, prompt_len=-(-longest // bucket) * bucket)
