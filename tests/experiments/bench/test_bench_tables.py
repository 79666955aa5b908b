"""experiments.bench.bench_tables: its --smoke breakdown partitions the measured wall time."""

import math
import subprocess
import sys
import time

import pytest

from experiments.bench import bench_tables


def bare_interpreter_startup(table: str) -> float:
    """Stands in for measure_startup (a full import of jax and kjax: 6-14 s on 2 busy
    cores); the in-process phases are what this test checks."""
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.time() - t0


@pytest.mark.slow  # ~45 s of compiles on 2 cores: the default tier is near its budget
def test_smoke_breakdown_phases_are_positive_and_fit_in_the_total(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_tables, "measure_startup", bare_interpreter_startup)
    b = bench_tables.breakdown("tang2025_table", workdir=tmp_path / "bench", smoke=True)
    phases = b["phases"]
    assert tuple(phases) == bench_tables.PHASES
    # Each phase is its wall time minus the compile inside it: a compile span counted twice
    # (nested JAX spans) or outside its phase would drive one of them to or below zero.
    assert all(s > 0 for s in phases.values()), phases
    assert sum(phases.values()) <= b["total_s"], (phases, b["total_s"])
    assert b["counts"] == {"steps": 2, "evals": 2, "checkpoint_saves": 1}  # smoke_base budget
    assert b["rl_step_ms"]["median_after_first"] > 0
    est = b["estimate"]
    assert (est["arms"], est["seeds"], est["steps"], est["evals_per_run"]) == (10, 20, 1000, 3)
    assert math.isclose(est["total_s"], sum(est["phases"].values()))
    step_s = b["rl_step_ms"]["median_after_first"] / 1e3
    assert math.isclose(est["phases"]["rl_steps"], 10 * 20 * 1000 * step_s)


@pytest.mark.slow  # ~35 s of compiles on 2 cores
def test_lockstep_smoke_breakdown_fits_in_the_total_and_scales_by_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_tables, "measure_startup", bare_interpreter_startup)
    b = bench_tables.lockstep_breakdown(
        "tang2025_table", workdir=tmp_path / "bench", seeds=2, smoke=True
    )
    phases = b["phases"]
    assert tuple(phases) == bench_tables.PHASES
    assert all(s > 0 for s in phases.values()), phases
    assert sum(phases.values()) <= b["total_s"], (phases, b["total_s"])
    assert b["counts"] == {"steps": 2, "evals": 2, "checkpoint_saves": 1}  # smoke_base budget
    for seed in (0, 1):  # both seeds trained, each in its own workdir
        assert (tmp_path / "bench" / f"seed{seed}" / "metrics.jsonl").exists()
    est = b["estimate"]
    assert math.isclose(est["total_s"], sum(est["phases"].values()))
    groups = 10 * math.ceil(20 / 2)  # 10 arms of 20 seeds in lockstep pairs
    step_s = b["step_ms"]["median_after_first"] / 1e3
    assert math.isclose(est["phases"]["rl_steps"], groups * 1000 * step_s)


def test_the_report_names_the_cpu_and_its_measured_matmul_peak():
    m = bench_tables.machine(repeats=2, n=128)
    assert m["cpu"] and m["cores"] >= 1 and 0 < m["matmul_gflops"] < 1e6
    b = {
        "table": "t", "arm": "a", "smoke": False, "cfg": {}, "devices": "1 x cpu",
        "load_average": 0.5, "compile_cache": None, "phases": {"rl_steps": 1.0},
        "other_s": 0.0, "total_s": 1.0, "machine": m,
    }  # fmt: skip
    header = bench_tables._header(b, "one run")
    assert header[2] == (
        f"{m['cpu']} ({m['cores']} cores), float32 matmul peak {m['matmul_gflops']:.0f} GFLOP/s"
    )
    del b["machine"]  # a breakdown measured without it (older JSON) reports without the line
    assert bench_tables._header(b, "one run")[2] == ""
