"""Every shipped preset parses and validates; bad values fail before compute, naming the field."""

import os
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

from experiments import train
from kjax import checkpoint
from kjax.rl.config import MeshConfig, ModelConfig, Operator, TrainConfig, to_json

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
    assert {
        "tiny_arith.py:mean",
        "tiny_arith.py:passk",
        "tiny_arith.py:majority",
        "smollm2_arith.py:passk",
        "llama31_8b_math.py:passk",
        "llama31_8b_math.py:codecontests",
        "qwen25_math_7b.py:drgrpo",
        "qwen3_8b_math.py:passk",
        "tiny_countdown.py:maxk",
        "tiny_countdown.py:passk",
    } <= names


@pytest.mark.parametrize("spec", PRESETS)
def test_every_preset_parses_and_validates(spec):
    cfg, workdir = train.parse([f"--config={spec}", "--workdir=/tmp/x"])
    assert isinstance(cfg, TrainConfig) and workdir == "/tmp/x"
    if any(m in spec for m in ("llama31", "qwen")):  # meshes of 8 x tensor devices, local paths
        cfg, _ = train.parse(
            [
                f"--config={spec}",
                "--workdir=/tmp/x",
                "--config.model.path=/m",
                "--config.task.manual_dir=/d",
            ]
        )
        cfg.validate(devices=16)
    else:
        cfg.validate(devices=8)
    assert to_json(cfg)["name"] == cfg.name


def test_overrides_are_typed():
    flags = [
        "--config.objective.k=4",
        "--config.rl.loss=ppo",
        "--config.dynamic_sampling=true",
        "--config.rl.dual_clip=3.0",
    ]
    cfg, _ = train.parse(
        ["--config=experiments/configs/tiny_arith.py:passk", "--workdir=w", *flags]
    )
    assert cfg.objective.k == 4 and cfg.rl.loss.value == "ppo"
    assert cfg.dynamic_sampling is True and cfg.rl.dual_clip == 3.0
    anneal = [
        "--config.k_schedule.kind=step",
        "--config.k_schedule.k_start=8",
        "--config.k_schedule.k_end=1",
        "--config.k_schedule.steps=50",
    ]
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
    argv = [
        "--config=experiments/configs/tiny_arith.py:passk",
        "--workdir=/nonexistent/w",
        override,
    ]
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


# Every configuration the trainer refuses because it has no correct gradient (or would
# silently do nothing), with what the message must name.
REFUSED = [
    (["rl.epochs=2"], r"rl.loss.*=PG.*Use rl.loss=PPO"),  # reuse without a ratio
    (  # a shrinkage baseline gives all-equal groups advantages: no informative-group filter
        [
            "objective.objective=mean",
            "objective.k=1",
            "objective.mean_baseline=shrinkage",
            "dynamic_sampling=true",
        ],  # fmt: skip
        r"dynamic_sampling.*SHRINKAGE",
    ),
    (["rl.minibatches=2"], r"rl.loss.*=PG.*Use rl.loss=PPO"),  # later minibatches: old policy
    (["rl.loss=ppo", "rl.kl_estimator=k1"], r"rl.kl_estimator.*K1.*expected.*gradient is 0"),
    (
        [
            "rl.loss=ppo",
            "rl.epochs=2",
            "rl.ratio_level=sequence",
            "rl.offpolicy_max_at_k=exact",
            "objective.objective=mean",
            "objective.k=1",
        ],
        r"rl.offpolicy_max_at_k.*MAX_AT_K.*MEAN",
    ),
    (
        [
            "rl.loss=ppo",
            "rl.epochs=2",
            "rl.ratio_level=sequence",
            "rl.offpolicy_max_at_k=exact",
            "objective.objective=majority_at_k",
        ],
        r"rl.offpolicy_max_at_k.*MAJORITY_AT_K",
    ),
    (
        [
            "rl.loss=ppo",
            "rl.epochs=2",
            "rl.ratio_level=sequence",
            "rl.offpolicy_max_at_k=linear",
            "objective.max_at_k_estimator=centered",
        ],
        r"rl.offpolicy_max_at_k.*CENTERED",
    ),
    (
        [
            "rl.loss=ppo",
            "rl.epochs=2",
            "rl.ratio_level=sequence",
            "rl.offpolicy_max_at_k=exact",
            "objective.max_at_k_estimator=chen_analytic",
        ],
        r"rl.offpolicy_max_at_k.*CHEN_ANALYTIC",
    ),
    (
        [
            "rl.loss=ppo",
            "rl.epochs=2",
            "rl.ratio_level=sequence",
            "rl.offpolicy_max_at_k=exact",
            "objective.max_at_k_estimator=loo",
        ],
        r"rl.offpolicy_max_at_k.*estimator LOO\b",
    ),
    (
        [
            "rl.loss=ppo",
            "rl.epochs=2",
            "rl.ratio_level=sequence",
            "rl.offpolicy_max_at_k=exact",
            "objective.k=1",
            "objective.objective=max_at_k_mixture",
            "objective.maxrl_t=4",
        ],
        r"rl.offpolicy_max_at_k.*MAX_AT_K_MIXTURE",
    ),
    (["rl.offpolicy_max_at_k=exact"], r"rl.offpolicy_max_at_k.*needs rl.loss=PPO"),  # PG
    (["rl.loss=ppo", "rl.offpolicy_max_at_k=exact"], r"epochs \* rl.minibatches > 1"),
    (["rl.offpolicy_clamp=0.2"], r"rl.offpolicy_clamp.*OFF"),  # would do nothing
    (  # a per-token ratio makes the off-policy update inexact beyond one token
        ["rl.loss=ppo", "rl.epochs=2", "rl.offpolicy_max_at_k=exact"],
        r"rl.offpolicy_max_at_k.*=EXACT needs rl.ratio_level=SEQUENCE",
    ),
    (["rl.ratio_level=sequence"], r"rl.ratio_level.*=SEQUENCE.*Set rl.loss=PPO"),  # PG
    (
        ["objective.objective=max_at_k_mixture", "objective.k=1", "objective.maxrl_t=32"],
        r"k=32 > N=16",
    ),
    (
        [
            "objective.objective=max_at_k_mixture",
            "objective.k=1",
            "objective.maxrl_t=4",
            "k_schedule.kind=step",
            "k_schedule.k_start=4",
            "k_schedule.k_end=1",
            "k_schedule.steps=5",
        ],
        r"k_schedule",
    ),
    (["objective.k=16", "objective.max_at_k_estimator=loo"], r"LOO needs N >= 17"),
    (["task.kind=math", "task.manual_dir=/d"], r"task.kind.*TINY"),
]


@pytest.mark.parametrize(("flags", "message"), REFUSED, ids=[";".join(f) for f, _ in REFUSED])
def test_configs_without_a_correct_gradient_are_refused(flags, message, capsys):
    argv = ["--config=experiments/configs/tiny_arith.py:passk", "--workdir=/nonexistent/w"]
    assert train.main(argv + [f"--config.{f}" for f in flags]) == 2
    assert re.search(message, capsys.readouterr().err), message


def test_operators_are_a_typed_tuple_on_the_command_line():
    base = ["--config=experiments/configs/tiny_arith.py:passk", "--workdir=w"]
    for text in ("add,sub,mul", "+,-,*", "ADD, -, mul"):
        cfg, _ = train.parse([*base, f"--config.task.operators={text}"])
        assert cfg.task.operators == (Operator.ADD, Operator.SUB, Operator.MUL)
    assert to_json(cfg)["task"]["operators"] == ["+", "-", "*"]
    for bad in ("+,/", "+-*", "add,add", ""):  # unknown, unseparated, repeated, empty
        assert train.main([*base, f"--config.task.operators={bad}"]) == 2


def test_task_kind_swaps_the_task_config_and_its_fields(capsys):
    base = ["--config=experiments/configs/tiny_arith.py:passk", "--workdir=w"]
    flags = ["--config.task.kind=countdown", "--config.task.count=4", "--config.task.reward=exact"]
    cfg, _ = train.parse([*base, *flags])
    assert type(cfg.task).__name__ == "Config" and cfg.task.kind == "countdown"
    assert (cfg.task.count, cfg.task.reward.value) == (4, "exact")
    assert to_json(cfg)["task"]["kind"] == "countdown"
    assert train.main([*base, "--config.task.kind=countdown", "--config.task.digits=2"]) == 2
    assert "task.digits" in capsys.readouterr().err  # arithmetic fields are not countdown's
    assert train.main([*base, "--config.task.kind=sudoku"]) == 2
    assert "arith, math, countdown" in capsys.readouterr().err


def test_one_mesh_and_one_dtype_resolution():
    assert MeshConfig().resolve(8) == (8, 1, 1) and MeshConfig(fsdp=2).batch_devices(8) == 8
    assert MeshConfig(data=2, fsdp=-1, tensor=2).resolve(8) == (2, 2, 2)
    with pytest.raises(ValueError, match="mesh"):
        MeshConfig(data=2, fsdp=2).resolve(8)  # uses 4 of 8 devices
    assert ModelConfig(dtype="bfloat16").compute_dtype == jnp.bfloat16
    assert ModelConfig().compute_dtype == jnp.float32


_PROBE = """
import sys
import {module}
loaded = [m for m in {forbidden} if m in sys.modules]
print(",".join(loaded))
"""


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        # configs are leaves: presets and tools read them without the trainer
        (
            "kjax.rl.config",
            [
                "kjax.rl.train_step",
                "kjax.rl.loop",
                "kjax.rl.objective",
                "kjax.rl.losses",
                "kjax.rl.forward",
                "kjax.models",
            ],
        ),
        # the update never calls back into the objective router
        ("kjax.rl.train_step", ["kjax.rl.objective", "kjax.objectives", "kjax.rl.loop"]),
    ],
)
def test_dependencies_point_one_way(module, forbidden):
    code = _PROBE.format(module=module, forbidden=forbidden)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
