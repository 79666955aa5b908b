"""experiments.evaluate: a checkpoint scored on its own task and on LiveBench-format
questions; per-category unbiased pass@k against the closed form; bad input exits 2."""

import json
import math
import pathlib

import numpy as np
import pytest

from experiments import evaluate
from experiments.tables import inference_strategies as infer
from kjax.inference import livebench as lb_scores
from kjax.rl.config import TrainConfig, override
from kjax.tasks import livebench

FIXTURES = pathlib.Path(__file__).parent.parent / "inference" / "fixtures" / "livebench"


def test_per_category_pass_at_k_is_the_unbiased_closed_form():
    rng = np.random.default_rng(0)
    scores = (rng.random((6, 8)) < 0.4).astype(np.float32)
    answers = np.where(scores >= 1, 0, rng.integers(1, 3, scores.shape)).astype(np.int32)
    examples = [{"category": c} for c in ("math", "math", "reasoning", "math", "reasoning", "x")]
    out = evaluate.by_category(examples, scores, answers)
    assert list(out) == ["all", "math", "reasoning", "x"]
    for name, rows in (("all", range(6)), ("math", [0, 1, 3]), ("reasoning", [2, 4])):
        for k in (1, 2, 4, 8):
            closed = np.mean(
                [1 - math.comb(8 - int(scores[r].sum()), k) / math.comb(8, k) for r in rows]
            )
            assert out[name][f"pass@{k}"] == pytest.approx(closed, abs=1e-6), (name, k)
        assert out[name]["problems"] == len(list(rows))


def test_a_run_is_scored_on_its_own_task_and_refuses_a_task_it_cannot_read(tmp_path, capsys):
    run = infer.smoke_run(tmp_path, "arith")
    assert evaluate.main([f"--workdir={run}", "--n=4", "--problems=8"]) == 0
    results = json.loads((run / "evaluate" / "arith.json").read_text())
    assert list(results) == ["all"] and results["all"]["problems"] == 8
    assert 0.0 <= results["all"]["pass@1"] <= results["all"]["pass@4"] <= 1.0
    assert "| all | 8 |" in capsys.readouterr().out
    # The arithmetic character model has no parentheses: countdown is refused, clearly.
    assert evaluate.main([f"--workdir={run}", "--task=countdown"]) == 2
    assert "characters" in capsys.readouterr().err
    assert evaluate.main([f"--workdir={run}", "--task=livebench"]) == 2  # natural language
    assert "TINY character-level" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        evaluate.main([f"--workdir={tmp_path / 'nope'}"])
    assert e.value.code == 2


class _WordTokenizer:
    """A chat tokenizer stand-in: one id per whitespace-separated word of the message."""

    eos_id = 2

    def encode_chat(self, messages):
        return [3] * len(messages[0]["content"].split())


def test_livebench_task_scores_like_livebench_and_keeps_scorable_active_questions(tmp_path):
    cfg = livebench.Config(manual_dir=str(FIXTURES))
    task = livebench.load(cfg, _WordTokenizer(), tmp_path / "data", eval_problems=100)
    rows = list(task.test)
    assert rows and all(lb_scores.is_scorable(r) and not r["removal_date"] for r in rows)
    assert {r["category"] for r in rows} == {"math", "reasoning"}  # coding has no scorer
    answers = [[f"**{r['ground_truth']}**", r["ground_truth"], "no idea", ""] for r in rows]
    v = task.verify(answers, rows)
    expected = [[lb_scores.score(r, a) for a in ans] for r, ans in zip(rows, answers, strict=True)]
    np.testing.assert_allclose(v.scores, expected)
    assert (v.answer_ids[v.scores >= 1] == 0).all() and (v.answer_ids[:, 3] == -1).all()
    math_only = livebench.load(
        livebench.Config(manual_dir=str(FIXTURES), category="math"), _WordTokenizer(),
        tmp_path / "data", eval_problems=100,
    )  # fmt: skip
    assert {r["category"] for r in math_only.test} == {"math"}


def test_livebench_is_evaluation_only():
    cfg = override(TrainConfig(), {"task.kind": "livebench", "task.manual_dir": "/d"})
    with pytest.raises(ValueError, match="evaluation-only"):
        cfg.validate(1)
