"""kill -9 a real training subprocess mid-run; rerunning the same command ends bitwise equal."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests import TEST_XLA_FLAGS

CMD = [sys.executable, "-m", "experiments.train", "--config=tests/rl/tiny_run.py:tiny"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": TEST_XLA_FLAGS,
       "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip


def _train(workdir, *extra):
    return subprocess.run([*CMD, f"--workdir={workdir}", *extra], env=ENV, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def _final(workdir, step):
    manager = ocp.CheckpointManager(workdir / "checkpoints")
    state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return state.state


def _losses(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


LAGGED = ["--config.rl.policy_lag=2", "--config.rl.lag_correction=EXACT"]
LORA = ["--config.model.lora.rank=4", "--config.model.lora.targets=q,v,o,down"]


@pytest.mark.parametrize(
    "extra",
    [
        # All three are in the slow tier (pytest -m slow), for the default tier's 15-minute
        # budget: the synchronous kill -9 resume (~45 s; the default tier kills a LoRA run
        # between steps, test_lora_kill_9_then_rerun_is_bitwise_identical below, and
        # tests/test_checkpoint.py a toy full-parameter run during a save, and checks the
        # bitwise resume), lag2's pending rollouts (~32 s) and LoRA's at lag 2 (~60 s).
        pytest.param([], id="sync", marks=pytest.mark.slow),
        pytest.param(LAGGED, id="lag2", marks=pytest.mark.slow),
        pytest.param([*LORA, *LAGGED], id="lora_lag2", marks=pytest.mark.slow),
    ],
)
def test_kill_9_then_rerun_is_bitwise_identical(tmp_path, extra):
    """lag2: the checkpoint also holds the two steps' rollouts drawn ahead (from older
    parameters) and the data position past them; the resumed run uses them, not new ones.
    lora_lag2: it holds the adapters and the base's fingerprint, not the base, which the
    rerun rebuilds from the config."""
    steps = ["--config.steps=18", "--config.optimizer.total_steps=18", *extra]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    # The uninterrupted run and the one to kill run side by side (2 cores).
    uninterrupted = subprocess.Popen(
        [*CMD, f"--workdir={whole}", *steps],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    proc = subprocess.Popen([*CMD, f"--workdir={broken}", *steps], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 300
    while not (broken / "checkpoints" / "6").exists() and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    out = uninterrupted.communicate(timeout=600)[0]
    assert uninterrupted.returncode == 0, out[-3000:]
    assert (whole / "pass_at_k_vs_step.png").exists() and (whole / "pass_at_k_vs_k.png").exists()
    assert list((whole / "tensorboard").glob("events.out.tfevents.*"))
    resumed = _train(broken, *steps)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step" in resumed.stdout + resumed.stderr

    _assert_same_run(whole, broken, 18)


def _assert_same_run(whole, broken, step):
    """The two runs' last checkpoints (parameters, or the LoRA adapters alone, optimizer
    state, step, key) equal bitwise, and so do their logged losses."""
    a, b = _final(whole, step), _final(broken, step)
    for x, y in zip(ocp.tree.to_flat_dict(a).items(), ocp.tree.to_flat_dict(b).items(),
                    strict=True):  # fmt: skip
        assert x[0] == y[0]
        np.testing.assert_array_equal(np.asarray(x[1]), np.asarray(y[1]), err_msg=str(x[0]))
    assert _losses(whole) == _losses(broken)


def _metrics(workdir):
    """Every logged metric by step but the wall-clock ones (a row the killed run wrote
    past its last checkpoint is written again by the rerun)."""
    rows = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(
            (k, v) for k, v in row.items() if not k.startswith("time/") and k != "tokens/real_per_s"
        )
    return rows


def _meta(workdir, step):
    return json.loads((workdir / "checkpoints" / str(step) / "meta" / "metadata").read_text())


def test_lora_kill_9_then_rerun_is_bitwise_identical(tmp_path, capsys):
    """The default tier's kill -9 of the real trainer (issue 47: LoRA at rank 2): killed
    between steps after checkpoint 6 of 18, the rerun restores the adapters, their
    optimizer state and the data position, rebuilds the frozen base from the config, and
    ends bitwise equal to the uninterrupted run. Only the killed run is a subprocess (with
    this process's XLA flags, so the same 8 devices and compiled steps, loaded from the
    session's persistent cache); the uninterrupted run and the rerun train here, which
    saves two interpreter starts and compiles."""
    from experiments import train

    args = ["--config=tests/rl/tiny_run.py:tiny", "--config.rl.microbatches=1",  # B=8 on 8
            "--config.steps=18", "--config.optimizer.total_steps=18",
            "--config.model.lora.rank=2", "--config.model.lora.targets=q,down"]  # fmt: skip
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert train.main([*args, f"--workdir={whole}"]) == 0
    env = {**ENV, "XLA_FLAGS": os.environ["XLA_FLAGS"]}  # conftest's: 8 devices, test flags
    proc = subprocess.Popen([sys.executable, "-m", "experiments.train", *args,
                             f"--workdir={broken}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 300
    while not (broken / "checkpoints" / "6").exists() and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    capsys.readouterr()
    assert train.main([*args, f"--workdir={broken}"]) == 0
    assert "resumed from step" in capsys.readouterr().out
    _assert_same_run(whole, broken, 18)
    params = [k for k in ocp.tree.to_flat_dict(_final(broken, 18)) if k[0] == "params"]
    assert params and all(k[-1].endswith(("_lora_a", "_lora_b")) for k in params), params
    assert _meta(whole, 18) == _meta(broken, 18)  # data position, the base's fingerprint
    assert "lora_base" in _meta(broken, 18)
    assert _metrics(whole) == _metrics(broken)  # rewards, losses, gradient norms, evals
