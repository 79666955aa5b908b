"""Task instructions and chat-template formatting: one user turn per problem, rendered
with the tokenizer's own chat template and an assistant generation prompt."""

from __future__ import annotations

import enum
from typing import Any, Protocol


class Task(enum.Enum):
    ARITH = "arith"
    COUNTDOWN = "countdown"
    MATH = "math"
    CODE = "code"
    HUMANEVAL = "humaneval"


class ChatTokenizer(Protocol):
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs) -> Any: ...


def instruction(task: Task, example: dict[str, Any]) -> str:
    """The user message for one decoded example of the task's dataset."""
    if task is Task.ARITH:
        return f"{example['question']} Put the final integer answer in \\boxed{{}}."
    if task is Task.COUNTDOWN:
        numbers = ", ".join(str(n) for n in example["numbers"])
        return (
            f"Using the numbers [{numbers}], each exactly once, and + - * / with "
            f"parentheses, make {example['target']}. Show your work, then give only the "
            "expression inside <answer></answer>."
        )
    if task is Task.MATH:
        return (
            f"{example['problem']}\nPlease reason step by step, and put your final answer "
            "within \\boxed{}."
        )
    if task is Task.CODE:
        return (
            f"{example['problem']}\nWrite a Python 3 program that reads standard input "
            "and writes standard output. Put the whole program in one ```python block."
        )
    return (
        "Complete the following Python function. Reply with the full function in one "
        f"```python block.\n```python\n{example['prompt']}```"
    )


def chat_prompt(
    tokenizer: ChatTokenizer, task: Task, example: dict[str, Any], system: str | None = None
) -> str:
    """The prompt text, rendered by the tokenizer's chat template.

    Raises ValueError naming the fix if the tokenizer has no chat template.
    """
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": instruction(task, example)}
    ]
    if getattr(tokenizer, "chat_template", "present") is None:
        raise ValueError(
            "the tokenizer has no chat template; load an instruct/chat model's "
            "tokenizer or set tokenizer.chat_template."
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
