"""Every task trains: countdown and code through the real RL loop (code through the
bubblewrap sandbox), and a task written as one module outside kjax trains by its path."""

import dataclasses
import json
import pathlib
import textwrap

import numpy as np
import pytest

from kjax.rl.config import (
    CodeConfig,
    CountdownConfig,
    EvalConfig,
    MeshConfig,
    ModelConfig,
    Objective,
    ObjectiveConfig,
    OptimizerConfig,
    SFTConfig,
    StepConfig,
    TrainConfig,
    override,
)
from kjax.rl.loop import train_and_evaluate
from tests.rewards.sandbox_env import require_bwrap

SMALL = TrainConfig(
    name="task_smoke",
    steps=2,
    batch_prompts=8,
    samples=4,
    max_new_tokens=12,
    objective=ObjectiveConfig(Objective.MAX_AT_K, k=2),
    rl=StepConfig(microbatches=1),
    optimizer=OptimizerConfig(learning_rate=1e-3, total_steps=2),
    model=ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    ),
    sft=SFTConfig(steps=0),
    eval=EvalConfig(every=2, n_eval=4, problems=8),
)


def _rows(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_countdown_sft_targets_are_solutions_the_verifier_accepts(tmp_path):
    from kjax.rl.task import load_task
    from kjax.tasks.base import CharTokenizer

    cfg = TrainConfig(task=CountdownConfig(train_size=40, test_size=8))
    task = load_task(cfg, None, tmp_path / "data")
    examples = list(task.test)
    targets = [[task.tokenizer.decode(task.target_ids(e))] for e in examples]
    assert all(t[0] and t[0] == e["solution"] for t, e in zip(targets, examples, strict=True))
    assert np.all(task.verify(targets, examples).scores == 1.0)
    # Prompts fit the task's exact bound: S never needs refitting for the tiny model.
    assert max(len(task.prompt_ids(e)) for e in examples) <= task.prompt_len
    assert task.prompt_ids(examples[0])[0] == CharTokenizer.bos_id
    # A near miss (15 for 16) earns 0.5 * (1 - 1/10) under NEAR_MISS, nothing under EXACT.
    puzzle = {"numbers": [3, 5, 7], "target": 16}
    answers = [["3+5+7", "(7-3)*5", "3+5+8", "x"]]  # off by 1, off by 4, misuses 8, junk
    np.testing.assert_allclose(task.verify(answers, [puzzle]).scores[0], [0.45, 0.3, 0, 0])
    exact = load_task(override(cfg, {"task.reward": "exact"}), None, tmp_path / "data")
    assert exact.verify(answers, [puzzle]).scores.tolist() == [[0.0, 0.0, 0.0, 0.0]]
    assert exact.verify([["3*7-5"]], [puzzle]).scores[0, 0] == 1.0


def test_countdown_trains_with_a_warm_start_and_a_continuous_reward(tmp_path):
    cfg = override(
        SMALL,
        {"task.kind": "countdown", "task.train_size": "64", "task.test_size": "8"},
    )
    cfg = dataclasses.replace(cfg, sft=SFTConfig(steps=3, batch_size=8))
    final = train_and_evaluate(cfg, tmp_path / "run", progress=False)
    rows = _rows(tmp_path / "run")
    steps = [r for r in rows if r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == [1, 2] and all(r["finite"] for r in steps)
    # max@k >= pass@k always (rewards in [0, 1], pass counts only exact hits).
    assert final["eval/max@4"] >= final["eval/pass@4"] >= 0.0


def _code_problems(root):
    double = {
        "name": "double",
        "description": "Read an integer n and print 2n.",
        "public_tests": {"input": ["3\n", "10\n"], "output": ["6\n", "20\n"]},
    }
    echo = {
        "name": "echo",
        "description": "Print the input line.",
        "public_tests": {"input": ["hi\n"], "output": ["hi\n"]},
    }
    d = root / "code_contests"
    d.mkdir(parents=True)
    for split in ("train", "test"):
        rows = [double, echo] * 4
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_code_verifier_scores_and_tallies_hostile_programs(tmp_path):
    require_bwrap()
    from kjax.rl.task import load_task

    cfg = TrainConfig(task=CodeConfig(manual_dir=str(_code_problems(tmp_path / "m")), timeout_s=1))
    task = load_task(cfg, None, tmp_path / "data")
    double = next(e for e in task.test if e["id"] == "double")
    fence = "```python\n{}\n```"
    programs = [
        fence.format("print(2 * int(input()))"),  # right
        fence.format("print(6)"),  # one of two tests
        fence.format("import time\ntime.sleep(60)"),  # hangs: the wall-clock limit stops it
        fence.format("raise SystemExit(3)"),  # crashes
        fence.format("import os\nopen('/etc/kjax_owned', 'w').write('x')\nprint(6)"),  # hostile
    ]
    v = task.verify([programs], [double])
    np.testing.assert_allclose(v.scores[0], [1.0, 0.5, 0.0, 0.0, 0.0])
    assert v.counts["passed"] == 3 and v.counts["timeout"] == 2 and v.counts["crashed"] == 4
    assert not pathlib.Path("/etc/kjax_owned").exists()
    binary = load_task(override(cfg, {"task.reward": "all"}), None, tmp_path / "data")
    np.testing.assert_allclose(binary.verify([programs], [double]).scores[0], [1, 0, 0, 0, 0])


@pytest.mark.slow  # ~61 s on 2 cores (64 sandboxed programs); the verifier tests stay
def test_code_trains_through_the_sandbox_and_logs_why_programs_fail(tmp_path):
    require_bwrap()
    manual = _code_problems(tmp_path / "m")
    settings = {"task.kind": "code", "task.manual_dir": str(manual), "task.timeout_s": "2.0"}
    # 2 samples (a sandboxed program costs ~0.5 s here): 64 programs over the run
    settings.update({"samples": "2", "eval.n_eval": "2"})
    cfg = override(SMALL, settings)
    train_and_evaluate(cfg, tmp_path / "run", progress=False)
    steps = [r for r in _rows(tmp_path / "run") if r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == [1, 2] and all(r["finite"] for r in steps)
    for r in steps:  # every test run of every sample is tallied by outcome, and timed
        runs = sum(r[f"verify/{o}"] for o in ("passed", "wrong", "crashed", "timeout", "lost"))
        programs = cfg.batch_prompts * cfg.samples * r["sample_batches"]
        assert programs <= runs <= 2 * programs  # each problem has one or two tests
        assert r["time/verify"] > 0


TOY = '''
"""A toy task: repeat the digit ("7:" -> "7")."""
import dataclasses

from kjax.tasks.base import CharTokenizer, Problems, TaskConfig, with_pool, wrap
from kjax.rewards.verdict import PromptVerdict, stack


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    problems: int = 40
    kind: str = dataclasses.field(default="{module}", init=False)


class Toy(Problems):
    def prompt_ids(self, example):
        return self.char_ids(example["digit"] + ":")

    def target_ids(self, example):
        return self.stop_after(example["digit"])

    def verify(self, completions, examples, pool=None):
        def one(row):
            outs, digit = row
            hits = [o == digit for o in outs]
            return PromptVerdict([float(h) for h in hits], [0 if h else -1 for h in hits])

        rows = list(zip(completions, [e["digit"] for e in examples]))
        return stack(with_pool(one, rows, completions, pool))


def tiny_tokenizer(cfg):
    return CharTokenizer("0123456789:")


def load(cfg, tokenizer, data_dir, eval_problems):
    rows = [{{"id": str(i), "digit": str(i % 10)}} for i in range(cfg.problems)]
    return wrap(Toy, cfg, {{"train": rows, "test": rows[:8]}}, tokenizer, eval_problems, 3)
'''


def test_a_task_is_one_module_outside_kjax(tmp_path, monkeypatch):
    from experiments import train

    package = tmp_path / "toy_tasks_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "digits.py").write_text(textwrap.dedent(TOY.format(module="toy_tasks_pkg.digits")))
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [
        "--config=tests/rl/tiny_run.py:tiny_sft",
        f"--workdir={tmp_path / 'run'}",
        "--config.task.kind=toy_tasks_pkg.digits",
        "--config.task.problems=30",
        "--config.steps=2",
        "--config.max_new_tokens=2",
        "--config.rl.microbatches=1",
    ]
    assert train.main(argv) == 0
    steps = [r for r in _rows(tmp_path / "run") if r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == [1, 2] and "eval/pass@4" in steps[-1]
    ident = json.loads((tmp_path / "run" / "experiment.json").read_text())
    assert ident["task"] == {
        "kind": "toy_tasks_pkg.digits",
        "problems": 30,
        "max_prompt_tokens": 0,
        "validation_size": 0,
    }


# SmolLM2-135M on HumanEval through the sandbox pool: minutes on 2 CPU cores (BUILD.md has
# the measured split), so `slow`; the tiny-model code run above stays in the default tier.
@pytest.mark.slow
def test_smollm2_trains_on_humaneval_through_the_sandbox_pool(tmp_path):
    require_bwrap()
    from experiments.configs import smollm2_humaneval

    # The tests' 8 host devices: data-parallel (the preset's default mesh) would hold 8
    # copies of the weights and Adam's moments, >23 GB (killed for memory on a 24 GiB
    # machine, 2026-12-07); fsdp holds one, split 8 ways.
    cfg = smollm2_humaneval.get_config("smoke")
    cfg = dataclasses.replace(cfg, mesh=MeshConfig(data=1, fsdp=-1))
    train_and_evaluate(cfg, tmp_path / "run", progress=False)
    steps = [r for r in _rows(tmp_path / "run") if r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == [1, 2] and all(r["finite"] for r in steps)
    for r in steps:  # every program is tallied by outcome
        outcomes = ("all_passed", "some_failed", "unreported", "lost")
        assert sum(r[f"verify/{o}"] for o in outcomes) == 16 * r["sample_batches"]
        print({n: round(r[f"time/{n}"], 2) for n in ("sample", "verify", "update", "step")})
