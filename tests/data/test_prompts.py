"""Prompts rendered with a real transformers tokenizer's chat template."""

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from kjax.data import prompts

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, "[UNK]")))
    tok.chat_template = TEMPLATE
    return tok


def test_chat_prompt_uses_the_template(tokenizer):
    text = prompts.chat_prompt(
        tokenizer, prompts.Task.ARITH, {"question": "What is 2 + 3?"}, system="Be brief."
    )
    assert text == (
        "<|system|>Be brief.<|end|><|user|>What is 2 + 3? Put the final integer "
        "answer in \\boxed{}.<|end|><|assistant|>"
    )


@pytest.mark.parametrize(
    ("task", "example", "needle"),
    [
        (prompts.Task.COUNTDOWN, {"numbers": [1, 2, 4], "target": 12}, "[1, 2, 4]"),
        (prompts.Task.MATH, {"problem": "Find x."}, "\\boxed{}"),
        (prompts.Task.CODE, {"problem": "Sum two ints."}, "```python"),
        (prompts.Task.HUMANEVAL, {"prompt": "def f(x):\n"}, "def f(x):"),
    ],
)
def test_every_task_has_an_instruction(task, example, needle):
    assert needle in prompts.instruction(task, example)


def test_missing_chat_template_is_a_clear_error(tokenizer):
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, "[UNK]")))
    with pytest.raises(ValueError, match="no chat template"):
        prompts.chat_prompt(bare, prompts.Task.MATH, {"problem": "p"})
