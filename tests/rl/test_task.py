"""Tasks: one module per kind in the registry, and every verifier goes through a given pool."""

import numpy as np

from kjax import tasks
from kjax.rl.config import to_json
from kjax.rl.task import decode, prompt_batch
from kjax.tasks import arith, code, countdown, humaneval, livebench, math
from kjax.tasks.arith import Arith
from kjax.tasks.base import CharTokenizer
from kjax.tasks.countdown import Countdown
from kjax.tasks.math import Math

ARITH_CHARS = CharTokenizer(arith.CHARS)


class RecordingPool:
    """A stand-in for kjax.rewards.pool.VerifierPool: runs fn in-process, counts items."""

    def __init__(self):
        self.items = 0

    def map(self, fn, items, *, default):
        self.items += len(items)
        return [fn(item) for item in items]


def _task(cls, chars=ARITH_CHARS, **fields):
    return cls(chars, [], [], 6, (CharTokenizer.eos_id,), **fields)


def test_the_registry_is_the_list_of_task_modules():
    modules = {m.Config.kind: m for m in (arith, math, countdown, code, humaneval, livebench)}
    assert {m.Config.kind: m for m in tasks.BUILTIN} == modules
    assert {k: tasks.module_of(k) for k in modules} == modules
    for kind, module in modules.items():
        assert tasks.config_class(kind)().kind == kind
        assert tasks.config_from_json(to_json(module.Config())) == module.Config()


def test_verifiers_use_the_pool_and_agree_without_it():
    cases = [
        (_task(Arith), [["12", "13", "x"], ["7", "", "07"]], [{"answer": 12}, {"answer": 7}]),
        (_task(Math), [["\\boxed{1/2}", "0.5", "\\boxed{3}"]], [{"answer": "\\frac{1}{2}"}]),
        (
            _task(Countdown, reward=countdown.Config().reward_shape()),
            [["(3+5)*7", "3*5+7", "(3+5)*7-1"]],
            [{"numbers": [3, 5, 7], "target": 56}],
        ),
    ]
    for task, completions, examples in cases:
        pool = RecordingPool()
        pooled = task.verify(completions, examples, pool)
        alone = task.verify(completions, examples)
        assert pool.items == len(examples), type(task).__name__  # the pool did the work
        np.testing.assert_array_equal(pooled.scores, alone.scores)
        np.testing.assert_array_equal(pooled.answer_ids, alone.answer_ids)
        assert pooled.scores[0, 0] == 1.0


def test_prompts_left_pad_and_completions_decode():
    task = _task(Arith)
    tokens, mask = prompt_batch(
        task, [{"question": "What is 1 + 2?"}, {"question": "What is 12 - 3?"}]
    )
    assert tokens.shape == (2, 6) and mask.sum(1).tolist() == [5, 6]
    assert ARITH_CHARS.decode(tokens[0][mask[0]][1:]) == "1+2="
    ids = np.asarray(ARITH_CHARS.encode("42") + [CharTokenizer.eos_id, 0])[None, None]
    assert decode(task, ids, np.ones(ids.shape, bool)) == [["42"]]


class _WordTokenizer:
    """A chat tokenizer stand-in: one id per whitespace-separated word of the message."""

    eos_id = 2

    def encode_chat(self, messages):
        return [3] * len(messages[0]["content"].split())


def test_pretrained_prompt_width_fits_the_longest_prompt_unless_configured(tmp_path):
    import dataclasses

    from kjax.data import loader
    from kjax.rl.config import ArithConfig, ModelConfig, ModelKind, TrainConfig
    from kjax.rl.task import load_task

    model = ModelConfig(kind=ModelKind.PRETRAINED, name="smollm2-135m-instruct")
    cfg = TrainConfig(model=model, task=ArithConfig(digits=2, train_size=60, test_size=10))
    tok = _WordTokenizer()
    task = load_task(cfg, tok, tmp_path / "data")
    train = [loader.decode(task.train[i]) for i in range(len(task.train))]
    longest = max(len(task.prompt_ids(e)) for e in train + list(task.test))
    assert longest > 0 and task.prompt_len % 16 == 0
    assert task.prompt_len - 16 < longest <= task.prompt_len
    tokens, mask = prompt_batch(task, train[:4])  # every prompt fits: no error
    assert tokens.shape == (4, task.prompt_len) and mask.any(axis=1).all()
    fixed = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, max_prompt_tokens=200))
    assert load_task(fixed, tok, tmp_path / "data").prompt_len == 200


def test_validation_split_is_held_out_of_training_and_disjoint_from_test():
    import pytest

    from kjax.rl.task import split_validation

    train = [{"id": f"p{i}", "question": "q", "answer": i} for i in range(10)]
    rest, validation = split_validation(train, 3, problems=2)
    assert [rest[i]["id"] for i in range(len(rest))] == [f"p{i}" for i in range(7)]
    assert [e["id"] for e in validation] == ["p7", "p8"]  # eval.problems of the 3 held out
    with pytest.raises(IndexError):
        rest[7]  # a held-out problem is never reachable through the train split
    assert split_validation(train, 0, problems=5) == (train, [])
    with pytest.raises(ValueError, match="task.validation_size=10"):
        split_validation(train, 10, problems=5)


def test_validation_eval_needs_a_validation_split():
    import dataclasses

    import pytest

    from kjax.rl.config import ArithConfig, EvalConfig, TrainConfig

    cfg = TrainConfig(eval=EvalConfig(split="validation", problems=8))
    with pytest.raises(ValueError, match="eval.split.*validation_size"):
        cfg.validate(1)
    ok = dataclasses.replace(cfg, task=ArithConfig(validation_size=100))
    assert ok.validate(1) is ok
    with pytest.raises(ValueError, match="task.validation_size"):
        ArithConfig(train_size=50, validation_size=50)
