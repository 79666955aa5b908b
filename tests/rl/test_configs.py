"""Every shipped preset parses and validates; bad values fail before compute, naming the field."""

import pathlib

import pytest

from experiments import train
from kjax import checkpoint
from kjax.rl.config import TrainConfig, to_json

CONFIGS = sorted(pathlib.Path("experiments/configs").glob("[!_]*.py"))


def _presets():
    for path in CONFIGS:
        text = path.read_text()
        assert text.startswith('"""python -m experiments.train --config='), path
        import runpy

        for name in runpy.run_path(str(path))["PRESETS"]:
            yield f"{path}:{name}"


PRESETS = list(_presets())


def test_there_are_the_required_presets():
    names = {p.split("/")[-1] for p in PRESETS}
    assert {"tiny_arith.py:mean", "tiny_arith.py:passk", "tiny_arith.py:majority",
            "smollm2_arith.py:passk", "llama31_8b_math.py:passk"} <= names  # fmt: skip


@pytest.mark.parametrize("spec", PRESETS)
def test_every_preset_parses_and_validates(spec):
    cfg, workdir = train.parse([f"--config={spec}", "--workdir=/tmp/x"])
    assert isinstance(cfg, TrainConfig) and workdir == "/tmp/x"
    if "llama31" in spec:  # its mesh wants 8 x tensor devices and local paths
        cfg, _ = train.parse([f"--config={spec}", "--workdir=/tmp/x", "--config.model.path=/m",
                              "--config.task.manual_dir=/d"])  # fmt: skip
        cfg.validate(devices=16)
    else:
        cfg.validate(devices=8)
    assert to_json(cfg)["name"] == cfg.name


def test_overrides_are_typed():
    flags = ["--config.objective.k=4", "--config.rl.loss=ppo", "--config.dynamic_sampling=true",
             "--config.rl.dual_clip=3.0"]  # fmt: skip
    cfg, _ = train.parse(
        ["--config=experiments/configs/tiny_arith.py:passk", "--workdir=w", *flags]
    )
    assert cfg.objective.k == 4 and cfg.rl.loss.value == "ppo"
    assert cfg.dynamic_sampling is True and cfg.rl.dual_clip == 3.0
    anneal = ["--config.k_schedule.kind=step", "--config.k_schedule.k_start=8",
              "--config.k_schedule.k_end=1", "--config.k_schedule.steps=50"]  # fmt: skip
    cfg, _ = train.parse(
        ["--config=experiments/configs/tiny_arith.py:passk", "--workdir=w", *anneal]
    )
    assert (cfg.k_schedule(49), cfg.k_schedule(50)) == (8, 1)


@pytest.mark.parametrize(
    "override, field",
    [
        ("--config.objective.k=32", "objective"),  # k > N = 16
        ("--config.objective.objective=best_of_n", "config.objective.objective"),
        ("--config.rl.loss=trpo", "rl.loss"),
        ("--config.mesh.data=3", "mesh"),  # 3 does not divide 8 devices
        ("--config.batch_prompts=12", "batch_prompts"),  # not a multiple of 8 devices
        ("--config.eval.n_eval=12", "eval.n_eval"),
        ("--config.steps=zero", "steps"),
        ("--config.no_such_field=1", "no_such_field"),
    ],
)
def test_bad_values_fail_fast_naming_the_field(override, field, capsys):
    argv = ["--config=experiments/configs/tiny_arith.py:passk", "--workdir=/nonexistent/w",
            override]  # fmt: skip
    assert train.main(argv) == 2
    assert field in capsys.readouterr().err


def test_unknown_preset_and_missing_file():
    assert train.main(["--config=experiments/configs/tiny_arith.py:nope", "--workdir=w"]) == 2
    assert train.main(["--config=nope.py:x", "--workdir=w"]) == 2


def test_workdir_of_a_different_experiment_is_refused(tmp_path, capsys):
    cfg, _ = train.parse(["--config=experiments/configs/tiny_arith.py:passk", "--workdir=w"])
    checkpoint.ensure_workdir(tmp_path, to_json(cfg))
    argv = ["--config=experiments/configs/tiny_arith.py:mean", f"--workdir={tmp_path}"]
    assert train.main(argv) == 2
    assert "different experiment" in capsys.readouterr().err
