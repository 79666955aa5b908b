"""What every task shares: its config's common fields, the Task protocol the trainer reads,
the character tokenizer of the tiny model, and prompt batching.

A task module (kjax/tasks/arith.py is the smallest) defines

  Config        a frozen dataclass subclassing TaskConfig, its `kind` the registry name;
  tiny_tokenizer(cfg) -> CharTokenizer   the tiny model's characters (or raises: the task
                has no character-level form);
  load(cfg, tokenizer, data_dir, eval_problems) -> Task   prepares the data once and wraps it.

docs/tasks.md walks through writing one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import ClassVar, Protocol

import numpy as np

from kjax._fields import check_int, need
from kjax.rewards.verdict import NO_ANSWER, PromptVerdict, Verdicts

# A pretrained model's default prompt width S is the longest prompt of the dataset rounded
# up to this: compute follows the real prompt length (an arith chat prompt of SmolLM2 has
# 49 tokens: S = 64), and S is fixed for the run, so nothing retraces.
PROMPT_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Fields every task has. Subclasses add their own and set `kind` (not an __init__
    argument: the class is the kind; `--config.task.kind=NAME` swaps the class)."""

    # S, prompts left-pad to it. 0: fit the data (the tiny model: the task's exact bound;
    # pretrained: the dataset's longest prompt rounded up to PROMPT_BUCKET, one pass).
    max_prompt_tokens: int = 0
    # The last validation_size problems of the train split, never trained on (SFT or RL):
    # the validation split (EvalSplit.VALIDATION). 0: none, the whole train split trains.
    validation_size: int = 0
    kind: str = dataclasses.field(default="", init=False)
    # Whether the task has reference answers to fine-tune on (an SFT warm start).
    sft_targets: ClassVar[bool] = True

    def __post_init__(self):
        check_int(self.max_prompt_tokens, "config.task.max_prompt_tokens", 0)
        check_int(self.validation_size, "config.task.validation_size", 0)

    def check(self, char_level: bool) -> None:
        """Checks that need the run's context (char_level: the tiny character model);
        raises ValueError naming the field and the fix. Override to add task rules."""


class CharTokenizer:
    """A character vocabulary: 0 pad, 1 bos, 2 eos, then one id per character of `chars`."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, chars: str):
        if len(set(chars)) != len(chars) or not chars:
            raise ValueError(f"CharTokenizer needs distinct characters; got {chars!r}.")
        self.chars = chars
        self.vocab_size = 3 + len(chars)

    def __eq__(self, other) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer({self.chars!r})"

    def encode(self, text: str) -> list[int]:
        unknown = set(text) - set(self.chars)
        if unknown:
            raise ValueError(f"CharTokenizer cannot encode {sorted(unknown)} in {text!r}.")
        return [3 + self.chars.index(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            if int(i) == self.eos_id:
                break
            if 3 <= int(i) < self.vocab_size:  # ids past the vocabulary (bench models) drop
                out.append(self.chars[int(i) - 3])
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
class Problems:
    """The splits and encodings every Task implementation holds (subclass and add
    prompt_ids, target_ids and verify; `char_level` tells which model reads it)."""

    tokenizer: object
    train: Sequence[dict]
    test: Sequence[dict]
    prompt_len: int
    stop_ids: tuple[int, ...]
    validation: Sequence[dict] = ()

    @property
    def char_level(self) -> bool:
        return isinstance(self.tokenizer, CharTokenizer)

    def chat_ids(self, text: str) -> list[int]:
        """A pretrained model's prompt: one user turn with its chat template."""
        return self.tokenizer.encode_chat([{"role": "user", "content": text}])

    def char_ids(self, text: str) -> list[int]:
        """The tiny model's prompt: bos, then the characters."""
        return [CharTokenizer.bos_id] + self.tokenizer.encode(text)

    def stop_after(self, text: str) -> list[int]:
        """An SFT target: text, then the stop token."""
        return self.tokenizer.encode(text) + [self.stop_ids[0]]


def timed_out(n: int) -> PromptVerdict:
    """The verdict of a prompt whose verification did not finish: 0, no answers."""
    return PromptVerdict([0.0] * n, [NO_ANSWER] * n)


def with_pool(verify_one, rows: list, completions, pool) -> list[PromptVerdict]:
    """[verify_one(row)] per prompt, through `pool` if given (a timed-out prompt scores 0)."""
    if pool is None:
        return [verify_one(r) for r in rows]
    out = pool.map(verify_one, rows, default=None)
    return [timed_out(len(c)) if r is None else r for r, c in zip(out, completions, strict=True)]


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
    from kjax.data import loader

    if size == 0:
        return train, []
    if size >= len(train):
        raise ValueError(
            f"task.validation_size={size} must be below the train split's {len(train)} "
            "problems (some must train); lower it."
        )
    rest = len(train) - size
    return _Head(train, rest), [loader.decode(train[rest + i]) for i in range(min(size, problems))]


def fit_prompt_len(task: Task, examples: Iterable[dict], bucket: int = 1) -> Task:
    """task with prompt_len = its longest prompt over examples, rounded up to `bucket`."""
    longest = max(len(task.prompt_ids(e)) for e in examples)
    return dataclasses.replace(task, prompt_len=-(-longest // bucket) * bucket)


def wrap(
    implementation: type[Problems],
    cfg: TaskConfig,
    source,
    tokenizer,
    eval_problems: int,
    char_prompt_len: int = 0,
    **fields,
) -> Task:
    """The Task over a prepared source ({"train", "test"} random-access splits of records).

    Keeps the first eval_problems test problems (decoded), holds cfg.validation_size train
    problems out, and sets prompt_len: cfg.max_prompt_tokens, else char_prompt_len for the
    tiny model, else the longest prompt over both splits rounded up to PROMPT_BUCKET.
    `fields` go to the implementation (task-specific settings such as a reward shape)."""
    from kjax.data import loader

    test = [
        loader.decode(source["test"][i]) for i in range(min(len(source["test"]), eval_problems))
    ]
    train, validation = split_validation(source["train"], cfg.validation_size, eval_problems)
    char_level = isinstance(tokenizer, CharTokenizer)
    stop = (tokenizer.eos_id,)
    prompt_len = cfg.max_prompt_tokens or (char_prompt_len if char_level else 0)
    task = implementation(tokenizer, train, test, prompt_len, stop, validation, **fields)
    if task.prompt_len:
        return task
    every = (loader.decode(source["train"][i]) for i in range(len(source["train"])))
    return fit_prompt_len(task, [*every, *test], bucket=1 if char_level else PROMPT_BUCKET)


def no_char_level(kind: str) -> None:
    """The error of a task that a character model cannot read."""
    need(
        False,
        "task.kind",
        f"cannot be read by a TINY character-level model ({kind} prompts are natural "
        "language); use model.kind=PRETRAINED or HF_DIR",
        kind,
    )
