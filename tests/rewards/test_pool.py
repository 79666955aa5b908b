"""The verifier pool: parallel, ordered, and one hung or crashing item never stalls it."""

import os
import signal
import time

import pytest

from kjax.rewards import code
from kjax.rewards import math as math_rewards
from kjax.rewards.pool import PoolConfig, VerifierPool
from tests.rewards.sandbox_env import require_bwrap


def square_or_misbehave(x):
    if x == "hang":
        time.sleep(3600)
    if x == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if x == "raise":
        raise KeyError("bad item")
    return x * x


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(PoolConfig(workers=2, item_timeout_s=2.0, startup_timeout_s=30.0)) as p:
        yield p


def test_hung_and_crashing_items_get_the_default(pool):
    assert pool.map(square_or_misbehave, [0, 0], default=-1) == [0, 0]  # warm both workers
    start = time.monotonic()
    out = pool.map(square_or_misbehave, [1, "hang", 2, "crash", 3, 4], default=-1)
    assert out == [1, -1, 4, -1, 9, 16]
    # Not a stall: the pool's own deadlines bound the batch (the hung item's timeout, then the
    # replacement worker's first item: its timeout plus the startup grace), ~34 s here against
    # the hour the hung item would take. A fixed few seconds failed on an overloaded machine,
    # where a fresh worker's interpreter start alone took ~10 s.
    cfg = pool.config
    assert time.monotonic() - start < 2 * cfg.item_timeout_s + cfg.startup_timeout_s
    assert pool.map(square_or_misbehave, [5, 6], default=-1) == [25, 36]  # pool recovered


def test_config_validation():
    with pytest.raises(ValueError, match="workers >= 1"):
        PoolConfig(workers=0)


def test_exceptions_propagate(pool):
    with pytest.raises(KeyError, match="bad item"):
        pool.map(square_or_misbehave, [1, "raise"], default=-1)
    assert pool.map(square_or_misbehave, [7], default=-1) == [49]


def test_math_verify_through_pool_matches_serial(pool):
    completions = [["\\boxed{2}", "the answer is 3", "x"], ["0.5", "\\boxed{\\frac{1}{2}}", "1"]]
    references = ["2", "1/2"]
    serial = math_rewards.verify(completions, references)
    pooled = math_rewards.verify(completions, references, pool=pool)
    assert pooled.scores.tolist() == serial.scores.tolist() == [[1, 0, 0], [1, 1, 0]]
    assert pooled.answer_ids.tolist() == serial.answer_ids.tolist() == [[0, 1, -1], [0, 0, 1]]


def test_code_verify_batch_scores_and_behaviour_classes(pool):
    require_bwrap()
    tests = [[("1 2", "3"), ("2 2", "4")]]
    programs = [
        "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
        "a, b = map(int, input().split())\nprint(b + a)",  # same behaviour: class 0
        "print(3)",  # passes 1 of 2
        "print(3)\n",  # same outputs as the previous one
        "raise SystemExit(1)",  # fails every run: no answer
    ]
    v = code.verify([programs], tests, timeout_s=2.0, pool=pool)
    assert v.scores.tolist() == [[1, 1, 0.5, 0.5, 0]]
    assert v.answer_ids.tolist() == [[0, 0, 1, 1, -1]]
