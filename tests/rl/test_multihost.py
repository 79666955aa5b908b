"""2 CPU processes (jax.distributed, gloo) train tiny_arith with the same losses as 1 process."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from tests import TEST_XLA_FLAGS

ARGS = ["-m", "experiments.train", "--config=tests/rl/tiny_run.py:tiny", "--config.steps=4",
        "--config.mesh.data=2"]  # fmt: skip


def _env(devices, **extra):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}",
           **extra}  # fmt: skip
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        if name not in extra:
            env.pop(name, None)
    return env


def _losses(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r], rows[-1]


# 3 JAX processes: ~45 s on 2 quiet cores. In the default tier on purpose: the issue's
# acceptance asks CI to run the 2-process test.
def test_two_processes_match_one(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen([sys.executable, *ARGS, f"--workdir={tmp_path / 'two'}"],
                         env=_env(1, JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                                  JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]  # fmt: skip
    one = subprocess.run([sys.executable, *ARGS, f"--workdir={tmp_path / 'one'}"], env=_env(2),
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert one.returncode == 0, one.stderr[-3000:]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    losses_one, last_one = _losses(tmp_path / "one")
    losses_two, last_two = _losses(tmp_path / "two")
    assert len(losses_one) == 4
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(last_two["eval/pass@4"], last_one["eval/pass@4"], atol=1e-6)
