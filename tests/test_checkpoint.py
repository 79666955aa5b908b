"""Checkpoints survive kill -9 at any moment; a half-written one is never restored."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kjax.checkpoint import CheckpointConfig, Checkpointer, ensure_workdir

ROOT = pathlib.Path(__file__).parent.parent


def toy(workdir, *extra, check=True):
    cmd = [sys.executable, "-m", "tests.checkpoint_toy", f"--workdir={workdir}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def start(workdir, *extra):
    cmd = [sys.executable, "-m", "tests.checkpoint_toy", f"--workdir={workdir}", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(predicate, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("clean")
    toy(workdir, "--steps=24")
    return np.load(workdir / "final_w.npy")


def committed_steps(ckdir):
    return [p for p in ckdir.glob("*") if p.name.isdigit()] if ckdir.exists() else []


def in_progress(ckdir):
    return ckdir.exists() and any("tmp" in p.name for p in ckdir.iterdir())


# In the slow tier (pytest -m slow), for the default tier's 15-minute budget: there the
# real trainer is killed between steps (tests/rl/test_resume.py, with LoRA) and this toy's
# full-parameter run mid-save (below), both resumed bitwise.
@pytest.mark.slow
def test_kill_between_steps_resumes_bitwise(tmp_path, uninterrupted):
    proc = start(tmp_path, "--steps=24")
    ckdir = tmp_path / "checkpoints"
    assert wait_for(lambda: len(committed_steps(ckdir)) >= 2, proc), "no checkpoint appeared"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "final_w.npy").exists()
    resumed = toy(tmp_path, "--steps=24")
    assert "resumed from step" in resumed.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "final_w.npy"), uninterrupted)


def test_kill_during_a_save_never_restores_the_partial_checkpoint(tmp_path, uninterrupted):
    proc = start(tmp_path, "--steps=24", "--ballast_mb=96")
    ckdir = tmp_path / "checkpoints"
    # Wait for a second save to be mid-write (a temporary directory exists), then kill.
    assert wait_for(lambda: len(committed_steps(ckdir)) >= 1 and in_progress(ckdir), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = [p.name for p in ckdir.iterdir() if "tmp" in p.name]
    resumed = toy(tmp_path, "--steps=24", "--ballast_mb=96")
    step = int(resumed.stdout.split("resumed from step ")[1].split()[0])
    assert all(not name.startswith(f"{step}.") for name in partial), (step, partial)
    np.testing.assert_array_equal(np.load(tmp_path / "final_w.npy"), uninterrupted)


# In the slow tier, for the same budget: tests/rl/test_loop.py stops the real trainer at
# a NaN and checks that it keeps the last good checkpoint and that a rerun resumes.
@pytest.mark.slow
def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    proc = toy(tmp_path, "--steps=24", "--nan_at=10", check=False)
    assert proc.returncode == 3
    assert "loss is nan at step 10" in proc.stderr
    with Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every=3, keep=2)) as ckpt:
        assert ckpt.latest_step() == 9
        state, meta = ckpt.restore(_toy_state_like())
        assert int(state["step"]) == 9 and meta["data_position"] == 9
        assert np.all(np.isfinite(np.asarray(state["params"]["w"])))


def _toy_state_like():
    params = {"w": jnp.zeros((32,)), "ballast": jnp.zeros((32 * 2**18,))}
    return {
        "params": params,
        "opt": optax.adam(1e-2).init(params),
        "step": jnp.int32(0),
        "rng": jax.random.key_data(jax.random.key(0)),
    }


def test_workdir_of_a_different_experiment_is_refused(tmp_path):
    ensure_workdir(tmp_path, {"preset": "tiny_arith", "k": 4})
    ensure_workdir(tmp_path, {"preset": "tiny_arith", "k": 4})  # same experiment: fine
    with pytest.raises(ValueError, match="different experiment .*fields differ: k"):
        ensure_workdir(tmp_path, {"preset": "tiny_arith", "k": 8})
    assert json.loads((tmp_path / "experiment.json").read_text())["k"] == 4
    assert not any(p.suffix == ".tmp" for p in tmp_path.iterdir())
    assert os.path.isdir(tmp_path)


def test_bad_config_values():
    with pytest.raises(ValueError, match="checkpoint.every"):
        CheckpointConfig(every=0)
    with pytest.raises(ValueError, match="checkpoint.keep"):
        CheckpointConfig(keep=0)
