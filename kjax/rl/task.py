"""The task seen by the trainer: problems as token ids, SFT targets, and the verifier.

A TINY model reads arithmetic character by character ("12+7=" -> "19<eos>"); pretrained
models get the chat-templated instruction of kjax.data.prompts and answer in \\boxed{}.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import numpy as np

from kjax.data import builders, loader, prompts, synthetic
from kjax.rewards import arith
from kjax.rewards.verdict import Verdicts
from kjax.rl.config import ModelKind, TaskConfig, TaskKind, TrainConfig

_OPS = {"+": synthetic.Operator.ADD, "-": synthetic.Operator.SUB, "*": synthetic.Operator.MUL}


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


@dataclasses.dataclass
class Task:
    """Problems of one split and how to score completions of them.

    tokenizer: CharTokenizer or kjax.tokenizer.Tokenizer. stop_ids: end of a completion.
    """

    cfg: TrainConfig
    tokenizer: object
    train: Sequence[dict]
    test: Sequence[dict]
    prompt_len: int
    stop_ids: tuple[int, ...]

    @property
    def char_level(self) -> bool:
        return isinstance(self.tokenizer, CharTokenizer)

    def prompt_ids(self, example: dict) -> list[int]:
        if self.char_level:
            expr = example["question"].removeprefix("What is ").rstrip("?").replace(" ", "")
            return [CharTokenizer.bos_id] + self.tokenizer.encode(expr + "=")
        task = prompts.Task.ARITH if self.cfg.task.kind is TaskKind.ARITH else prompts.Task.MATH
        message = {"role": "user", "content": prompts.instruction(task, example)}
        return self.tokenizer.encode_chat([message])

    def target_ids(self, example: dict) -> list[int]:
        """The SFT completion: the answer, then the stop token."""
        answer = example["answer"]
        text = str(answer) if self.char_level else f"The answer is \\boxed{{{answer}}}."
        return self.tokenizer.encode(text) + [self.stop_ids[0]]

    def prompt_batch(self, examples: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded (prompts [B,S] int32, mask [B,S] bool), S = prompt_len (no retrace)."""
        ids = [self.prompt_ids(e) for e in examples]
        longest = max(len(i) for i in ids)
        if longest > self.prompt_len:
            raise ValueError(f"a prompt has {longest} tokens > task.max_prompt_tokens="
                             f"{self.prompt_len}; raise it.")  # fmt: skip
        tokens = np.zeros((len(ids), self.prompt_len), np.int32)
        mask = np.zeros((len(ids), self.prompt_len), bool)
        for row, seq in enumerate(ids):
            tokens[row, self.prompt_len - len(seq) :] = seq
            mask[row, self.prompt_len - len(seq) :] = True
        return tokens, mask

    def decode(self, tokens: np.ndarray, mask: np.ndarray) -> list[list[str]]:
        """Completions [B,N,T] -> [B][N] strings (masked tokens only)."""
        B, N, _ = tokens.shape
        return [[self.tokenizer.decode(tokens[b, i][mask[b, i]]) for i in range(N)]
                for b in range(B)]  # fmt: skip

    def verify(self, completions: list[list[str]], examples: Sequence[dict], pool=None
               ) -> Verdicts:  # fmt: skip
        refs = [e["answer"] for e in examples]
        if self.cfg.task.kind is TaskKind.ARITH:
            if pool is None:
                return arith.verify(completions, refs)
            rows = pool.map(_arith_row, list(zip(completions, refs, strict=True)), default=None)
            return _stack(rows, len(completions[0]))
        from kjax.rewards import math as math_rewards  # math-verify is slow to import

        return math_rewards.verify(completions, refs)


def _arith_row(item):
    return arith.verify_prompt(*item)


def _stack(rows, n):
    from kjax.rewards.verdict import NO_ANSWER, PromptVerdict, stack

    fallback = PromptVerdict([0.0] * n, [NO_ANSWER] * n)  # a timed-out row scores 0
    return stack([fallback if r is None else r for r in rows])


def load_task(cfg: TrainConfig, tokenizer, data_dir: str | pathlib.Path) -> Task:
    """Prepares the dataset (once, array_record under data_dir) and wraps it as a Task."""
    t: TaskConfig = cfg.task
    if t.kind is TaskKind.ARITH:
        spec = synthetic.ArithSpec(digits=t.digits, operands=t.operands,
                                   operators=tuple(_OPS[c] for c in t.operators))  # fmt: skip
        name = f"d{t.digits}o{t.operands}{''.join('psm'['+-*'.index(c)] for c in t.operators)}"
        name += f"n{t.train_size}t{t.test_size}s{t.data_seed}"
        bcfg = builders.ArithConfig(name=name, spec=spec, train_size=t.train_size,
                                    test_size=t.test_size, seed=t.data_seed)  # fmt: skip
        builder = loader.prepare(builders.KjaxArith, data_dir, config=bcfg)
    else:
        builder = loader.prepare(builders.MathJsonl, data_dir, config="math",
                                 manual_dir=t.manual_dir)  # fmt: skip
    source = builder.as_data_source()
    test = [loader.decode(source["test"][i]) for i in range(min(len(source["test"]),
                                                                 cfg.eval.problems))]  # fmt: skip
    if cfg.model.kind is ModelKind.TINY:
        tok = CharTokenizer()
        prompt_len = 1 + t.operands * (t.digits + 1)  # bos, operands, operators and "="
        stop = (CharTokenizer.eos_id,)
    else:
        tok = tokenizer
        prompt_len = t.max_prompt_tokens or 128
        stop = (tok.eos_id,)
    if t.max_prompt_tokens:
        prompt_len = t.max_prompt_tokens
    return Task(cfg, tok, source["train"], test, prompt_len, stop)
