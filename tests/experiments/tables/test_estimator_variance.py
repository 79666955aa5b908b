"""The estimator-variance experiment: exact gradient, unbiased means, outputs, CLI errors."""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments.tables import estimator_variance as ev


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
    E = ev.E  # CENTERED's bias and MaxRL with L2O are left out: compiling each cell dominates
    config = ev.Config(
        group_sizes=(4, 8),
        trials=20_000,
        seed=1,
        estimators=(E.S, E.LOO, E.L2O, E.LOO_MINUS_ONE),
        maxrl_estimators=(E.LOO_MINUS_ONE,),
    )
    results = ev.run(config, tmp_path)
    for name in ("variance.md", "variance.png", "signal_density.png", "results.json"):
        assert (tmp_path / name).stat().st_size > 0
    exact = results["true_gradient"]
    rows = {
        (r["estimator"], r["N"]): r
        for r in json.loads((tmp_path / "results.json").read_text())["rows"]
    }
    maxrl = results["true_gradient_maxrl"]
    grads = [ev.true_gradient(config.theta, config.sigma, j) for j in range(1, config.k + 1)]
    np.testing.assert_allclose(maxrl, sum(g / j for j, g in enumerate(grads, 1)), rtol=1e-12)
    targets = {"S": exact, "LOO": exact, "L2O": exact, "LOO_MINUS_ONE": exact}
    targets |= {ev.maxrl_name(4, e): maxrl for e in config.maxrl_estimators}
    assert len(targets) == 5
    for name, target in targets.items():
        for n in (4, 8):
            if (name, n) in rows:  # a fixed seed; 5 standard errors is a 1-in-10^6 event
                r = rows[(name, n)]
                assert abs(r["mean"] - target) < 5 * r["stderr"], (name, n, r, target)
    # Rows that need N > k are absent at N == k, present above it.
    assert ("L2O", 4) not in rows and ("LOO", 4) not in rows and ("L2O", 8) in rows
    assert (ev.maxrl_name(4, E.LOO_MINUS_ONE), 4) in rows
    # The baselines must cut the variance of the plain estimator by a wide margin.
    assert rows[("LOO_MINUS_ONE", 8)]["var"] < 0.2 * rows[("S", 8)]["var"]


def test_cli_rejects_group_size_below_k(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.tables.estimator_variance",
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


def test_variance_page_has_the_experiments_rows_and_exact_gradients():
    """The variance table of docs/estimator_variance.md is the experiment's output: same rows
    and columns, and the exact gradients it quotes are the quadrature's (cell values need
    the full run)."""
    readme = (pathlib.Path(__file__).parents[3] / "docs" / "estimator_variance.md").read_text()
    section = readme.split("Variance of the d/dtheta estimate of max@4")[1]
    table = [line for line in section.split("\n\n")[1].splitlines() if line.startswith("|")]
    config = ev.Config()
    assert table[0] == "| estimator | " + " | ".join(f"N={n}" for n in config.group_sizes) + " |"
    assert [line.split(" | ")[0][2:] for line in table[2:]] == [
        name for name, _, _ in ev.row_specs(config)
    ]
    grads = [ev.true_gradient(config.theta, config.sigma, j) for j in range(1, config.k + 1)]
    assert f"the exact gradient is {grads[-1]:.5f}" in readme
    assert f"sum_(j<=4) J_j'/j = {sum(g / j for j, g in enumerate(grads, 1)):.5f}" in readme


def test_binary_maxrl_rows_share_the_mixtures_mean_exactly():
    """MaxRL's practical form and the mixture at T = N - 1 (both estimators) have the same
    exact mean on binary rewards, grad J_{N-1}; variances are positive and differ."""
    rows = ev.binary_maxrl_variance(ps=(0.1, 0.6), ns=(3, 5))
    assert len(rows) == 3 * 2 * 2
    for r in rows:
        np.testing.assert_allclose(r["mean"], r["target"], rtol=1e-10, atol=1e-13)
        assert r["var"] > 0
    table = ev.binary_table(rows)
    assert table.count("\n| ") == 5 and "grad J_(N-1)" in table
