"""Tokenizer: a transformers tokenizer (HF dir or GGUF) with chat template and left padding.

Prompts are left-padded so every row's last prompt token sits at column S-1, where the
sampler starts decoding; `mask` marks real tokens.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

Message = dict[str, str]  # {"role": "user" | "system" | "assistant", "content": str}


@dataclasses.dataclass
class Tokenizer:
    """Thin wrapper over a transformers tokenizer (`hf`) with kjax's batch conventions."""

    hf: Any

    @property
    def pad_id(self) -> int:
        pad = self.hf.pad_token_id
        return self.hf.eos_token_id if pad is None else pad

    @property
    def eos_id(self) -> int:
        return self.hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, no special tokens added."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of a conversation through the chat template, ending with the
        assistant turn's header (the model continues as the assistant)."""
        if not getattr(self.hf, "chat_template", None):
            where = getattr(self.hf, "name_or_path", "") or "this tokenizer"
            raise ValueError(
                f"{where} has no chat template (tokenizer_config.json's chat_template, or "
                "chat_template.jinja); copy the model's tokenizer files into it, or use "
                "encode() for raw text."
            )
        ids = self.hf.apply_chat_template(list(messages), add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(i) for i in ids]

    def pad_left(self, sequences: Sequence[Sequence[int]], length: int | None = None):
        """Left-pads id lists into (tokens [B,S] int32, mask [B,S] bool).

        S is the longest sequence unless `length` is given (then every sequence must fit).
        """
        longest = max(len(s) for s in sequences)
        S = longest if length is None else length
        if longest > S:
            raise ValueError(f"a sequence of {longest} tokens does not fit length={S}")
        tokens = np.full((len(sequences), S), self.pad_id, np.int32)
        mask = np.zeros((len(sequences), S), bool)
        for row, seq in enumerate(sequences):
            if len(seq):
                tokens[row, S - len(seq) :] = seq
                mask[row, S - len(seq) :] = True
        return tokens, mask

    def chat_batch(self, conversations: Sequence[Sequence[Message]], length: int | None = None):
        """Chat-templated, left-padded prompt batch: (tokens [B,S] int32, mask [B,S] bool)."""
        return self.pad_left([self.encode_chat(c) for c in conversations], length)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def load(path: str) -> Tokenizer:
    """Tokenizer of a HF model directory or of a .gguf file (tokenizer + template inside)."""
    import transformers

    if path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file {path} not found")
        from kjax.models.gguf_file import check_gguf

        check_gguf(path)
        directory, name = os.path.split(os.path.abspath(path))
        return Tokenizer(transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is neither a HF model directory nor a .gguf file")
    if not any(os.path.isfile(os.path.join(path, n)) for n in _TOKENIZER_FILES):
        raise ValueError(
            f"{path} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); copy the model's "
            "tokenizer files (tokenizer.json, tokenizer_config.json) into it."
        )
    return Tokenizer(transformers.AutoTokenizer.from_pretrained(path))


# A HF folder's tokenizer is one of these (fast, sentencepiece, BPE vocabulary).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
