"""Tasks: one implementation per TaskKind, and every verifier goes through a given pool."""

import numpy as np

from kjax.rl.config import TaskKind
from kjax.rl.task import TASKS, ArithTask, CharTokenizer, MathTask, decode, prompt_batch


class RecordingPool:
    """A stand-in for kjax.rewards.pool.VerifierPool: runs fn in-process, counts items."""

    def __init__(self):
        self.items = 0

    def map(self, fn, items, *, default):
        self.items += len(items)
        return [fn(item) for item in items]


def _task(cls):
    return cls(CharTokenizer(), [], [], 6, (CharTokenizer.eos_id,))


def test_every_task_kind_has_one_implementation():
    assert {kind: impl for kind, (impl, _) in TASKS.items()} == {
        TaskKind.ARITH: ArithTask,
        TaskKind.MATH: MathTask,
    }


def test_verifiers_use_the_pool_and_agree_without_it():
    cases = [
        (ArithTask, [["12", "13", "x"], ["7", "", "07"]], [{"answer": 12}, {"answer": 7}]),
        (MathTask, [["\\boxed{1/2}", "0.5", "\\boxed{3}"]], [{"answer": "\\frac{1}{2}"}]),
    ]
    for cls, completions, examples in cases:
        task, pool = _task(cls), RecordingPool()
        pooled = task.verify(completions, examples, pool)
        alone = task.verify(completions, examples)
        assert pool.items == len(examples), cls.__name__  # the pool did the work
        np.testing.assert_array_equal(pooled.scores, alone.scores)
        np.testing.assert_array_equal(pooled.answer_ids, alone.answer_ids)
        assert pooled.scores[0, 0] == 1.0


def test_prompts_left_pad_and_completions_decode():
    task = _task(ArithTask)
    tokens, mask = prompt_batch(
        task, [{"question": "What is 1 + 2?"}, {"question": "What is 12 - 3?"}]
    )
    assert tokens.shape == (2, 6) and mask.sum(1).tolist() == [5, 6]
    assert CharTokenizer().decode(tokens[0][mask[0]][1:]) == "1+2="
    ids = np.asarray(CharTokenizer().encode("42") + [CharTokenizer.eos_id, 0])[None, None]
    assert decode(task, ids, np.ones(ids.shape, bool)) == [["42"]]
