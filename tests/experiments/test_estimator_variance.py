"""The estimator-variance experiment: exact gradient, unbiased means, outputs, CLI errors."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments import estimator_variance as ev


def test_expected_max_reward_k1_equals_direct_integral():
    # J_1 = E[g(X)] = int_0^1 x^2 phi((x - theta)/sigma)/sigma dx, a different integral.
    theta, sigma = 0.45, 0.1
    x = np.linspace(0.0, 1.0, 200_001)
    dens = np.exp(-0.5 * ((x - theta) / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi))
    direct = np.trapezoid(x * x * dens, x)
    with jax.enable_x64(True):
        got = float(ev.expected_max_reward(jnp.float64(theta), sigma, 1))
    np.testing.assert_allclose(got, direct, rtol=1e-6)


def test_run_writes_outputs_and_unbiased_means(tmp_path):
    config = ev.Config(group_sizes=(4, 8), trials=20_000, seed=1)
    results = ev.run(config, tmp_path)
    for name in ("variance.md", "variance.png", "signal_density.png", "results.json"):
        assert (tmp_path / name).stat().st_size > 0
    exact = results["true_gradient"]
    rows = {
        (r["estimator"], r["N"]): r
        for r in json.loads((tmp_path / "results.json").read_text())["rows"]
    }
    for name in ("S", "LOO", "LOO_MINUS_ONE"):
        for n in (4, 8):
            if (name, n) in rows:  # a fixed seed; 5 standard errors is a 1-in-10^6 event
                r = rows[(name, n)]
                assert abs(r["mean"] - exact) < 5 * r["stderr"], (name, n, r, exact)
    # The baselines must cut the variance of the plain estimator by a wide margin.
    assert rows[("LOO_MINUS_ONE", 8)]["var"] < 0.2 * rows[("S", 8)]["var"]


def test_cli_rejects_group_size_below_k(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.estimator_variance",
            f"--workdir={tmp_path}",
            "--group_sizes=2,4",
            "--k=4",
            "--trials=10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "--group_sizes must all be >= k=4" in proc.stderr
    assert not (tmp_path / "results.json").exists()
